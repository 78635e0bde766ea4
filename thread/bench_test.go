package thread_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// BenchmarkFinish measures Finish on a demo-like run (a reasoning message, a
// tool call with streamed arguments and its result, then n text deltas)
// after a transcript of 20 messages; it reports the cost per event, which
// stays flat as replies grow.
func BenchmarkFinish(b *testing.B) {
	for _, n := range []int{200, 20000} {
		b.Run("deltas="+strconv.Itoa(n), func(b *testing.B) { benchmarkFinish(b, n) })
	}
}

func benchmarkFinish(b *testing.B, n int) {
	evs := []json.RawMessage{
		json.RawMessage(`{"type":"CUSTOM","name":"run.accepted","value":{}}`),
		json.RawMessage(`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`),
		json.RawMessage(`{"type":"TEXT_MESSAGE_START","messageId":"r.msg1","role":"assistant","metadata":{"tanstack":{"createdAt":"2026-01-02T03:04:05.000Z"}}}`),
		json.RawMessage(`{"type":"REASONING_START","messageId":"r.rs1"}`),
		json.RawMessage(`{"type":"REASONING_MESSAGE_START","messageId":"r.rs1","role":"reasoning"}`),
		json.RawMessage(`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r.rs1","delta":"thinking"}`),
		json.RawMessage(`{"type":"REASONING_MESSAGE_END","messageId":"r.rs1"}`),
		json.RawMessage(`{"type":"REASONING_END","messageId":"r.rs1"}`),
		json.RawMessage(`{"type":"TOOL_CALL_START","toolCallId":"r.call1","toolCallName":"get_weather","parentMessageId":"r.msg1"}`),
		json.RawMessage(`{"type":"TOOL_CALL_ARGS","toolCallId":"r.call1","delta":"{\"city\":"}`),
		json.RawMessage(`{"type":"TOOL_CALL_ARGS","toolCallId":"r.call1","delta":"\"Paris\"}"}`),
		json.RawMessage(`{"type":"TOOL_CALL_END","toolCallId":"r.call1"}`),
		json.RawMessage(`{"type":"TOOL_CALL_RESULT","messageId":"r.res1","toolCallId":"r.call1","content":"{\"temp\":20}"}`),
	}
	for i := 1; i <= n; i++ {
		evs = append(evs, json.RawMessage(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r.msg1","delta":"t`+strconv.Itoa(i)+` "}`))
	}
	evs = append(evs, json.RawMessage(`{"type":"TEXT_MESSAGE_END","messageId":"r.msg1"}`),
		json.RawMessage(`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`))
	var settled thread.Transcript
	for i := 0; i < 10; i++ {
		id := strconv.Itoa(i)
		settled.Messages = append(settled.Messages,
			thread.Message{ID: "u" + id, Role: "user", Parts: []thread.Part{{Type: "text", Content: "question " + id}}},
			thread.Message{ID: "a" + id, Role: "assistant", Parts: []thread.Part{{Type: "text", Content: "answer " + id}}})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tr := settled
		if err := tr.Finish("r", evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}

// BenchmarkTranscriptJSON decodes and encodes the transcript of a thread of 150 turns (a
// user message and an assistant reply of text, a tool call and its result each), as a
// thread's store does twice a turn (when it accepts a run and when the run ends).
func BenchmarkTranscriptJSON(b *testing.B) {
	var tr thread.Transcript
	for i := range 150 {
		id := strconv.Itoa(i)
		tr.Messages = append(tr.Messages,
			thread.Message{ID: "u" + id, Role: "user", Parts: []thread.Part{{Type: "text", Content: "a question about the weather in Paris, number " + id}}},
			thread.Message{ID: "a" + id, Role: "assistant", CreatedAt: "2026-01-02T03:04:05.000Z", Parts: []thread.Part{
				{Type: "tool-call", ID: "c" + id, Name: "get_weather", Arguments: `{"city":"Paris"}`, Input: json.RawMessage(`{"city":"Paris"}`), Output: json.RawMessage(`{"temp":20}`), State: "input-complete"},
				{Type: "tool-result", ToolCallID: "c" + id, Content: `{"temp":20}`, State: "complete"},
				{Type: "text", Content: "It is 20 degrees in Paris today, with a light wind from the west and no rain expected."}}})
	}
	enc, err := json.Marshal(tr)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			var t thread.Transcript
			if err := json.Unmarshal(enc, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			if _, err := json.Marshal(tr); err != nil {
				b.Fatal(err)
			}
		}
	})
}
