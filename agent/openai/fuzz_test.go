package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/agent/internal/sse"
	"github.com/wsgateway/wsgateway/protocol"
)

// FuzzConverter feeds arbitrary chunks (one per line) to the converter: whatever the server
// sends, the events it emits are ones the turn's pipeline accepts, and the stream ends either
// with RUN_FINISHED or with an error (which the turn reports as RUN_ERROR).
func FuzzConverter(f *testing.F) {
	for _, s := range []string{
		sseChunk(`{"content":"a"}`, "") + "\n" + sseChunk(`{}`, "stop") + "\n[DONE]",
		sseChunk(`{"reasoning_content":"r"}`, "") + "\n" + sseChunk(`{"content":"a"}`, "") + "\n" + sseChunk(`{"tool_calls":[{"index":1,"id":"x","function":{"name":"f","arguments":"{"}}]}`, "") + "\n" + sseChunk(`{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]}`, "tool_calls") + "\n[DONE]",
		sseChunk(`{"tool_calls":[{"function":{"name":"f"}},{"function":{"name":"g"}},{"id":"z","function":{"arguments":"1"}}]}`, "") + "\n" + sseChunk(`{"reasoning":"x"}`, "length"),
		`{"error":{"message":"m","code":429}}`,
		sseChunk(`{"tool_calls":[{"index":0,"id":"r1.call1","function":{"name":"f"}},{"index":1,"function":{"name":"g"}}]}`, "stop") + "\n" + sseChunk(`{"tool_calls":[{"index":0,"function":{"name":"f"}}]}`, "stop") + "\n[DONE]",
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"a"}}]}}]}` + "\n" + `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"late"}}]},"finish_reason":"tool_calls"}]}`,
	} {
		f.Add(s)
	}
	in, err := protocol.DecodeRunAgentInput([]byte(frame))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pipe := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: true})
		var last string
		c := &converter{in: in, model: "m", emit: func(ev []byte) error {
			last = string(ev)
			if _, err := pipe.Push(ev); err != nil {
				t.Fatalf("the pipeline refuses %s: %v", ev, err)
			}
			return nil
		}}
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
		err := error(nil)
		for _, line := range strings.Split(s, "\n") {
			if err = c.event(sse.Event{Data: line}, func(s string) string { return s }); err != nil {
				break
			}
		}
		switch {
		case errors.Is(err, errDone):
			err = nil
		case err == nil:
			err = c.eof()
		}
		if err == nil {
			err = c.finish()
		}
		if err == nil && !strings.Contains(last, `"RUN_FINISHED"`) {
			t.Fatalf("no error, and the last event is %s", last)
		}
		if err == nil && !pipe.Terminated() {
			t.Fatal("the pipeline is not terminated after RUN_FINISHED")
		}
	})
}
