package sse

import (
	"io"
	"strings"
	"testing"
)

// BenchmarkReader parses a stream of typical AG-UI content events (about 90 bytes each).
func BenchmarkReader(b *testing.B) {
	ev := `data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"run-1.msg1","delta":"a token or two "}` + "\n\n"
	stream := strings.Repeat(ev, 1000)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		r := NewReader(strings.NewReader(stream), 0)
		n := 0
		for {
			_, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 1000 {
			b.Fatalf("read %d events, want 1000", n)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "events/s")
}
