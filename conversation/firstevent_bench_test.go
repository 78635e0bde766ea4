package conversation_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/usage"
)

// BenchmarkFirstEvent measures turns one after another on one socket, three in each thread
// (b.N threads): the time from the run frame's write to its first event's receipt
// (run.accepted), the time every user waits before anything shows. It reports the median
// and the 99th percentile of a thread's first turn (new-), of its second (next-), whose run
// frame, a new message, is sent as the first's terminal arrives, while the first's end is
// written to the thread, and of a regenerate of the second's reply sent the same way
// (regen-: the reply is read from its log if its end has not reached the thread, and kept as
// a branch, THREADS.md section 7).
//
//	go test -run '^$' -bench FirstEvent -benchtime 300x ./conversation/
func BenchmarkFirstEvent(b *testing.B) {
	firstEvent(b, envOptions{}, script{Tokens: 1})
}

// BenchmarkFirstEventLedger is BenchmarkFirstEvent with a usage ledger and a token budget:
// every turn's start checks the budget, and every turn reports a usage that its end records
// (in the background, on the same NATS).
//
//	go test -run '^$' -bench 'FirstEvent(Ledger)?$' -benchtime 300x ./conversation/
func BenchmarkFirstEventLedger(b *testing.B) {
	firstEvent(b, envOptions{usage: &usage.Config{Budget: 1 << 40}}, script{Tokens: 1, Usage: 10})
}

// firstEvent runs BenchmarkFirstEvent on a gateway of o, its turns' agent doing sc.
func firstEvent(b *testing.B, o envOptions, sc script) {
	o.runFrameRate, o.runFrameBurst = 1e6, 1e6
	e := newEnv(b, o)
	cl := dial(b, e.url(), "")
	var lat [3][]time.Duration
	for i := range b.N {
		thread := fmt.Sprintf("first-%d-%d", b.N, i)
		for turn := range 3 {
			// The second turn posts a message of its own (the first one's id again would be a
			// regenerate); the third posts the thread's messages up to the second's again.
			msgs := []string{fmt.Sprintf("u%d", turn), "hello"}
			if turn == 2 {
				msgs = []string{"u0", "hello", "u1", "hello"}
			}
			sent := time.Now()
			cl.send(threadFrame(thread, fmt.Sprintf("%s-%d", thread, turn), sc, msgs...))
			f := cl.next(20 * time.Second)
			lat[turn] = append(lat[turn], time.Since(sent))
			if f.err != nil || f.Type != "CUSTOM" {
				b.Fatalf("first frame %s (%v), want run.accepted", f.raw, f.err)
			}
			cl.untilTerminal()
		}
	}
	for turn, name := range []string{"new", "next", "regen"} {
		l := lat[turn]
		slices.Sort(l)
		b.ReportMetric(float64(l[len(l)/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(l[len(l)*99/100].Microseconds()), name+"-p99-µs")
	}
}

// BenchmarkFirstEventLongThread measures the first event of every turn of one thread of 150
// turns, one after the other on one socket, each run frame carrying the thread's user
// messages so far (as a client posts its history) and sent as the previous turn's terminal
// arrives: a turn's start reads, merges and writes the whole thread, so its time grows with
// the thread. It reports the median over turns 1 to 10, 71 to 80 and 141 to 150.
//
//	go test -run '^$' -bench FirstEventLongThread -benchtime 3x ./conversation/
func BenchmarkFirstEventLongThread(b *testing.B) {
	e := newEnv(b, envOptions{runFrameRate: 1e6, runFrameBurst: 1e6})
	cl := dial(b, e.url(), "")
	const turns = 150
	var lat []time.Duration
	for i := range b.N {
		thread := fmt.Sprintf("long-%d-%d", b.N, i)
		var msgs []string
		for k := range turns {
			msgs = append(msgs, fmt.Sprintf("u%d", k), strings.Repeat("a question ", 20))
			sent := time.Now()
			cl.send(threadFrame(thread, fmt.Sprintf("%s-%d", thread, k), script{Tokens: 30}, msgs...))
			f := cl.next(20 * time.Second)
			lat = append(lat, time.Since(sent))
			if f.err != nil || f.Type != "CUSTOM" {
				b.Fatalf("turn %d: first frame %s (%v), want run.accepted", k, f.raw, f.err)
			}
			cl.untilTerminal()
		}
	}
	for _, from := range []int{0, 70, 140} {
		var l []time.Duration
		for i := 0; i < len(lat); i += turns {
			l = append(l, lat[i+from:i+from+10]...)
		}
		slices.Sort(l)
		b.ReportMetric(float64(l[len(l)/2].Microseconds()), fmt.Sprintf("turn%d-p50-µs", from+1))
	}
}
