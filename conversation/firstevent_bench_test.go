package conversation_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkFirstEvent measures turns one after another on one socket, two in each thread
// (b.N threads): the time from the run frame's write to its first event's receipt
// (run.accepted), the time every user waits before anything shows. It reports the median
// and the 99th percentile of a thread's first turn (new-) and of its second (next-), whose
// run frame is sent as the first's terminal arrives, while the first's end is written to the
// thread.
//
//	go test -run '^$' -bench FirstEvent -benchtime 300x ./conversation/
func BenchmarkFirstEvent(b *testing.B) {
	e := newEnv(b, envOptions{runFrameRate: 1e6, runFrameBurst: 1e6})
	cl := dial(b, e.url(), "")
	var lat [2][]time.Duration
	for i := range b.N {
		thread := fmt.Sprintf("first-%d-%d", b.N, i)
		for turn := range 2 {
			sent := time.Now()
			cl.send(threadFrame(thread, fmt.Sprintf("%s-%d", thread, turn), script{Tokens: 1}, "u", "hello"))
			f := cl.next(20 * time.Second)
			lat[turn] = append(lat[turn], time.Since(sent))
			if f.err != nil || f.Type != "CUSTOM" {
				b.Fatalf("first frame %s (%v), want run.accepted", f.raw, f.err)
			}
			cl.untilTerminal()
		}
	}
	for turn, name := range []string{"new", "next"} {
		l := lat[turn]
		slices.Sort(l)
		b.ReportMetric(float64(l[len(l)/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(l[len(l)*99/100].Microseconds()), name+"-p99-µs")
	}
}
