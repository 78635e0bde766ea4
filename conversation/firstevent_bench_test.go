package conversation_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkFirstEvent measures turns one after another on one socket, each of a thread: the
// time from the run frame's write to its first event's receipt (run.accepted), the time every
// user waits before anything shows. "new thread" starts each turn in a thread of its own;
// "same thread" continues one thread, each run frame sent once the previous turn's terminal
// arrived (while that turn's thread is being finished). It reports the median and the 99th
// percentile.
//
//	go test -run '^$' -bench FirstEvent -benchtime 400x ./conversation/
func BenchmarkFirstEvent(b *testing.B) {
	e := newEnv(b, envOptions{runFrameRate: 1e6, runFrameBurst: 1e6})
	for _, same := range []bool{false, true} {
		name := map[bool]string{false: "new thread", true: "same thread"}[same]
		b.Run(name, func(b *testing.B) {
			cl := dial(b, e.url(), "")
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				thread := fmt.Sprintf("first-%s-%d", b.Name(), i)
				if same {
					thread = "first-" + b.Name()
				}
				sent := time.Now()
				cl.send(threadFrame(thread, fmt.Sprintf("%s-%d", thread, i), script{Tokens: 1}, "u", "hello"))
				f := cl.next(20 * time.Second)
				lat = append(lat, time.Since(sent))
				if f.err != nil || f.Type != "CUSTOM" {
					b.Fatalf("first frame %s (%v), want run.accepted", f.raw, f.err)
				}
				cl.untilTerminal()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
