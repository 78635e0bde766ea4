package usage_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/usage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openStore opens a run log store: on an embedded NATS server when url is empty, else on
// the server of url.
func openStore(t *testing.T, url string) *jetstream.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.Config{URLs: url, Logger: slog.New(slog.DiscardHandler)}
	if url == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := jetstream.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("jetstream.Open() = %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newLedger opens a ledger on store's JetStream.
func newLedger(t *testing.T, store *jetstream.Store, cfg usage.Config) *usage.Ledger {
	t.Helper()
	cfg.JetStream = store.JetStream()
	cfg.Agent = "test"
	l, err := usage.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("usage.New() = %v", err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// flush waits for the records in flight of l, and closes it.
func flush(t *testing.T, l *usage.Ledger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close() = %v", err)
	}
}

func report(t *testing.T, l *usage.Ledger, principal string) *usage.Report {
	t.Helper()
	r, err := l.Report(context.Background(), principal, time.Time{}, time.Time{})
	if err != nil {
		t.Fatalf("Report(%s) = %v", principal, err)
	}
	return r
}

func run(principal, thread, runID string, model string, in, out int64) usage.Run {
	return usage.Run{Principal: principal, ThreadID: thread, RunID: runID, Generation: 1,
		Usage: map[string]metrics.Usage{model: {Input: in, Output: out, Total: in + out}}}
}

// TestRecordOnce records one run several times, from two ledgers on one NATS (a retry, a
// second producer of the same run): the ledger counts it once; the next generation of its
// runId counts once more.
func TestRecordOnce(t *testing.T) {
	a := openStore(t, "")
	b := openStore(t, a.ClientURL())
	la, lb := newLedger(t, a, usage.Config{}), newLedger(t, b, usage.Config{})
	r := run("alice", "th-1", "run-1", "m", 3, 40)
	for range 3 {
		la.Record(r)
		lb.Record(r)
	}
	flush(t, la)
	flush(t, lb)
	l := newLedger(t, a, usage.Config{})
	got := report(t, l, "alice")
	if got.Counts != (usage.Counts{Input: 3, Output: 40, Total: 43, Runs: 1}) {
		t.Fatalf("report = %+v, want the run counted once: in 3, out 40, total 43, 1 run", got.Counts)
	}
	// The runId started again (a resubmit: the next generation of its log) ran its agent
	// again: it counts again, once.
	r.Generation = 2
	l.Record(r)
	l.Record(r)
	flush(t, l)
	got = report(t, newLedger(t, b, usage.Config{}), "alice")
	if got.Counts != (usage.Counts{Input: 6, Output: 80, Total: 86, Runs: 2}) {
		t.Fatalf("report = %+v, want both generations of the run, each once", got.Counts)
	}
}

// TestTotalsEqualSum records many runs of two threads and two models from two ledgers on
// one NATS at once: the totals and the breakdowns equal the sums of the runs' usage.
func TestTotalsEqualSum(t *testing.T) {
	a := openStore(t, "")
	b := openStore(t, a.ClientURL())
	la, lb := newLedger(t, a, usage.Config{}), newLedger(t, b, usage.Config{})
	var want usage.Counts
	byThread := map[string]usage.Counts{}
	byModel := map[string]usage.Counts{}
	var wg sync.WaitGroup
	for i := range 40 {
		thread, model := fmt.Sprintf("th-%d", i%2), fmt.Sprintf("model-%d", i%3)
		r := run("alice", thread, fmt.Sprintf("run-%d", i), model, int64(i), int64(2*i+1))
		c := usage.Counts{Input: int64(i), Output: int64(2*i + 1), Total: int64(3*i + 1), Runs: 1}
		want = add(want, c)
		byThread[thread] = add(byThread[thread], c)
		byModel[model] = add(byModel[model], c)
		l := la
		if i%2 == 1 {
			l = lb
		}
		wg.Go(func() { l.Record(r) })
	}
	wg.Wait()
	flush(t, la)
	flush(t, lb)
	got := report(t, newLedger(t, b, usage.Config{}), "alice")
	if got.Counts != want {
		t.Errorf("totals = %+v, want %+v", got.Counts, want)
	}
	if len(got.Threads) != 2 || len(got.Models) != 3 {
		t.Fatalf("breakdowns = %+v, %+v, want 2 threads and 3 models", got.Threads, got.Models)
	}
	for _, th := range got.Threads {
		if th.Counts != byThread[th.ThreadID] {
			t.Errorf("thread %s = %+v, want %+v", th.ThreadID, th.Counts, byThread[th.ThreadID])
		}
	}
	for _, m := range got.Models {
		if m.Counts != byModel[m.Model] {
			t.Errorf("model %s = %+v, want %+v", m.Model, m.Counts, byModel[m.Model])
		}
	}
}

func add(a, b usage.Counts) usage.Counts {
	return usage.Counts{Input: a.Input + b.Input, Output: a.Output + b.Output, Total: a.Total + b.Total, Runs: a.Runs + b.Runs}
}

// TestReportIsolation: a principal's report never holds another's runs, even of the same
// runId and thread.
func TestReportIsolation(t *testing.T) {
	store := openStore(t, "")
	l := newLedger(t, store, usage.Config{})
	l.Record(run("alice", "th", "run-1", "m", 1, 10))
	l.Record(run("bob", "th", "run-1", "m", 2, 200))
	l.Record(run("bob", "th-b", "run-2", "m", 3, 300))
	flush(t, l)
	l = newLedger(t, store, usage.Config{})
	alice, bob := report(t, l, "alice"), report(t, l, "bob")
	if alice.Counts != (usage.Counts{Input: 1, Output: 10, Total: 11, Runs: 1}) || len(alice.Threads) != 1 {
		t.Errorf("alice's report = %+v", alice)
	}
	if bob.Counts != (usage.Counts{Input: 5, Output: 500, Total: 505, Runs: 2}) || len(bob.Threads) != 2 {
		t.Errorf("bob's report = %+v", bob)
	}
	if carol := report(t, l, "carol"); carol.Runs != 0 || len(carol.Threads) != 0 {
		t.Errorf("carol's report = %+v, want nothing", carol)
	}
}

// TestBudgetRenews: a principal that used its budget is refused until the next period;
// another principal is not; a principal's own budget (SetBudget) replaces the default.
func TestBudgetRenews(t *testing.T) {
	store := openStore(t, "")
	const period = 2 * time.Second
	l := newLedger(t, store, usage.Config{Period: period, Budget: 50})
	// Start at the beginning of a period, so that the record and the checks fall in it.
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period)))
	l.Record(run("alice", "th", "run-1", "m", 10, 45))
	other := newLedger(t, openStore(t, store.ClientURL()), usage.Config{Period: period, Budget: 50})
	testenv.WaitFor(t, 20*time.Second, "alice over budget on the gateway that recorded", func() bool { return l.Exceeded("alice") })
	testenv.WaitFor(t, 20*time.Second, "alice over budget on another gateway (its watch)", func() bool { return other.Exceeded("alice") })
	if l.Exceeded("bob") {
		t.Fatal("bob, who used nothing, is over budget")
	}
	l.SetBudget("alice", 100, time.Now().Add(time.Hour))
	if l.Exceeded("alice") {
		t.Fatal("alice over a budget of 100 having used 55")
	}
	l.ClearBudget("alice")
	if !l.Exceeded("alice") {
		t.Fatal("alice not over the default budget once her own is cleared")
	}
	testenv.WaitFor(t, 20*time.Second, "alice's budget renewed in the next period", func() bool { return !l.Exceeded("alice") && !other.Exceeded("alice") })
	rep := report(t, l, "alice")
	if rep.Budget == nil || rep.Budget.Tokens != 50 || rep.Budget.Used != 0 {
		t.Errorf("the next period's budget = %+v, want 50 tokens, none used", rep.Budget)
	}
}

// TestRange: reports cover whole periods; a bad range is refused with ErrRange.
func TestRange(t *testing.T) {
	l := newLedger(t, openStore(t, ""), usage.Config{Period: time.Hour})
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	from, to, err := l.Range(day.Add(90*time.Minute), day.Add(150*time.Minute))
	if err != nil || !from.Equal(day.Add(time.Hour)) || !to.Equal(day.Add(3*time.Hour)) {
		t.Errorf("Range(01:30, 02:30) = %v, %v, %v; want 01:00, 03:00", from, to, err)
	}
	from, to, err = l.Range(time.Time{}, day.Add(2*time.Hour))
	if err != nil || !from.Equal(day.Add(time.Hour)) || !to.Equal(day.Add(2*time.Hour)) {
		t.Errorf("Range(zero, 02:00) = %v, %v, %v; want 01:00, 02:00", from, to, err)
	}
	for _, c := range [][2]time.Time{{day, day}, {day, day.Add(-time.Hour)}, {day, day.Add(usage.MaxReportPeriods*time.Hour + time.Minute)}} {
		if _, _, err := l.Range(c[0], c[1]); !errors.Is(err, usage.ErrRange) {
			t.Errorf("Range(%v, %v) = %v, want ErrRange", c[0], c[1], err)
		}
	}
}

// BenchmarkExceeded measures the budget check a turn's start makes: a read of the totals in
// memory, no NATS round trip.
func BenchmarkExceeded(b *testing.B) {
	ctx := context.Background()
	s, err := jetstream.Open(ctx, jetstream.Config{DataDir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l, err := usage.New(ctx, usage.Config{JetStream: s.JetStream(), Budget: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	for b.Loop() {
		l.Exceeded("alice@example.com")
	}
}
