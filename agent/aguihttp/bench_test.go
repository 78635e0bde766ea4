package aguihttp

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkRun relays a turn of 10000 content events from a loopback AG-UI server.
func BenchmarkRun(b *testing.B) {
	const n = 10000
	ev := `data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"run-1.msg1","delta":"a token or two "}` + "\n\n"
	stream := strings.Repeat(ev, n)
	srv := upstream(b, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, stream)
	})
	a := newAgent(b, Config{URL: srv.URL})
	in := input(b)
	b.ReportAllocs()
	for b.Loop() {
		got := 0
		if err := a.Run(context.Background(), in, func([]byte) error { got++; return nil }); err != nil || got != n {
			b.Fatalf("Run = %d events, %v", got, err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
}
