package jetstream

import (
	"context"
	"testing"
	"time"
)

// BenchmarkReplayShort measures a resume of a closed 1,000-event log from its start, the
// time from Read to the last entry (last-µs) and the part of it Read takes (open-µs): with
// the events stored in a few batch messages (an agent faster than the log, as the gateway's
// demo agent with no pause) and with one message per event (an agent slower than a
// publish's round trip, as a model streaming tokens).
//
//	go test -run '^$' -bench ReplayShort -benchtime 200x ./jetstream/
func BenchmarkReplayShort(b *testing.B) {
	for _, c := range []struct {
		name    string
		perMsg  int
		nEvents int
	}{{"batched", 1000, 1000}, {"message-per-event", 1, 1000}} {
		b.Run(c.name, func(b *testing.B) {
			s, _ := benchStore(b)
			ctx := context.Background()
			w, err := s.Create(ctx, "bench", "short", "t")
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < c.nEvents; i += c.perMsg {
				var events [][]byte
				for j := i; j < i+c.perMsg && j < c.nEvents; j++ {
					events = append(events, event("short", j))
				}
				mustAppend(b, w, events)
			}
			if err := w.Close(ctx); err != nil {
				b.Fatal(err)
			}
			var open, total time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				r, err := s.Read(ctx, "bench", "short", FromStart)
				if err != nil {
					b.Fatal(err)
				}
				open += time.Since(t0)
				n := 0
				for {
					if _, err := r.Next(ctx); err != nil {
						break
					}
					n++
				}
				total += time.Since(t0)
				r.Close()
				if n != c.nEvents {
					b.Fatalf("replayed %d events, want %d", n, c.nEvents)
				}
			}
			b.ReportMetric(float64(open.Microseconds())/float64(b.N), "open-µs")
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "last-µs")
		})
	}
}
