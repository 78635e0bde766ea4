package thread_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// FuzzTranscript feeds arbitrary inputs and event logs (one event a line) to
// Accept, Active and Finish: none may panic, and a transcript must survive its
// JSON round trip unchanged.
func FuzzTranscript(f *testing.F) {
	for _, th := range threads() {
		for _, r := range th.Runs {
			f.Add([]byte(`{"messages":[{"id":"u1","role":"user","content":"hi"}]}`), bytes.Join(rawLines(r.Events), []byte("\n")))
		}
	}
	f.Add([]byte(`{"messages":[{"id":"x","role":"tool","toolCallId":"c1","content":"{}"}],"resume":[{"interruptId":"i1","payload":{"approved":false}}]}`),
		[]byte(`{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"","role":"reasoning","content":"r"},{"role":"tool","toolCallId":"c1","content":[{"type":"text","text":"t"}]}]}`))
	f.Fuzz(func(t *testing.T, input, log []byte) {
		var tr thread.Transcript
		_ = tr.Accept("r1", input)
		var events []json.RawMessage
		for _, l := range bytes.Split(log, []byte("\n")) {
			if json.Valid(l) {
				events = append(events, json.RawMessage(l))
			}
		}
		tr.Active("r1", events)
		if err := tr.Finish("r1", events); err != nil {
			return
		}
		_ = tr.Accept("r2", input)
		b, err := json.Marshal(tr)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		var again thread.Transcript
		if err := json.Unmarshal(b, &again); err != nil {
			t.Fatalf("Unmarshal(%s): %v", b, err)
		}
		if b2, _ := json.Marshal(again); !bytes.Equal(b, b2) {
			t.Fatalf("round trip changed the transcript:\n%s\n%s", b, b2)
		}
	})
}

func rawLines(events []json.RawMessage) [][]byte {
	out := make([][]byte, len(events))
	for i, e := range events {
		out[i] = e
	}
	return out
}
