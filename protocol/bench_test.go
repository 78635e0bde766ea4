package protocol

import (
	"fmt"
	"testing"
)

// turnEvents returns a typical turn: RUN_STARTED, one text message of n
// content deltas (explicit or as chunks), RUN_FINISHED.
func turnEvents(n int, chunked bool) [][]byte {
	evs := [][]byte{[]byte(`{"type":"RUN_STARTED","threadId":"thread-1","runId":"run-1724320000000-k3j9x2"}`)}
	if !chunked {
		evs = append(evs, []byte(`{"type":"TEXT_MESSAGE_START","messageId":"msg-1","role":"assistant"}`))
	}
	for i := 0; i < n; i++ {
		switch {
		case !chunked:
			evs = append(evs, []byte(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg-1","delta":"token %d of the answer, "}`, i)))
		case i == 0:
			evs = append(evs, []byte(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CHUNK","messageId":"msg-1","delta":"token %d of the answer, "}`, i)))
		default:
			evs = append(evs, []byte(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CHUNK","delta":"token %d of the answer, "}`, i)))
		}
	}
	if !chunked {
		evs = append(evs, []byte(`{"type":"TEXT_MESSAGE_END","messageId":"msg-1"}`))
	}
	return append(evs, []byte(`{"type":"RUN_FINISHED","threadId":"thread-1","runId":"run-1724320000000-k3j9x2"}`))
}

// BenchmarkPipeline measures decode, schema check, expansion, verification
// and envelope encoding of whole turns on one goroutine.
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range []struct {
		name    string
		chunked bool
	}{{"text", false}, {"chunked", true}} {
		b.Run(bc.name, func(b *testing.B) {
			turn := turnEvents(200, bc.chunked)
			var buf []byte
			in, out := 0, 0
			b.ReportAllocs()
			for b.Loop() {
				p := NewPipeline(PipelineOptions{})
				for _, data := range turn {
					events, err := p.Push(data)
					if err != nil {
						b.Fatal(err)
					}
					for _, e := range events {
						buf = AppendEnvelope(buf[:0], "1724320000000-42", e.JSON())
						out++
					}
					in++
				}
				if !p.Terminated() {
					b.Fatal("turn not terminated")
				}
			}
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(in)/secs, "events/s")
			b.ReportMetric(float64(out)/secs, "out-events/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkDecodeEvent measures the schema check of single events.
func BenchmarkDecodeEvent(b *testing.B) {
	for _, bc := range []struct{ name, event string }{
		{"content", `{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg-1","delta":"token 17 of the answer, "}`},
		{"messages", `{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"u1","role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{"type":"url","value":"https://example.com/a.png"}}]},{"id":"a1","role":"assistant","content":"hello","toolCalls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := []byte(bc.event)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeEvent(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
