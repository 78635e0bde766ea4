package threadstore

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/jetstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// storeConfig configures a test's stores: the run store the thread store is beside, and the
// thread store.
type storeConfig struct {
	jetstream.Config
	Threads Config
}

// testConfig returns a config for tests: short timers, an embedded server of the test's own.
func testConfig(tb testing.TB) storeConfig {
	tb.Helper()
	return storeConfig{Config: jetstream.Config{
		DataDir:        tb.TempDir(),
		LeaseTTL:       3 * time.Second,
		JoinWait:       300 * time.Millisecond,
		PublishTimeout: 2 * time.Second,
	}, Threads: Config{PublishTimeout: 2 * time.Second}}
}

// openStore opens a run store and a thread store beside it (s.runs), both closed at the end
// of the test.
func openStore(tb testing.TB, cfg storeConfig) *Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runs, err := jetstream.Open(ctx, cfg.Config)
	if err != nil {
		tb.Fatalf("jetstream.Open: %v", err)
	}
	tb.Cleanup(func() { runs.Close() })
	s, err := Open(ctx, runs, cfg.Threads)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// mustAppend appends events to w and waits until every one is stored.
func mustAppend(tb testing.TB, w *jetstream.Writer, events [][]byte) {
	tb.Helper()
	errs := make(chan error, len(events))
	for _, e := range events {
		w.Append(e, func(_ string, err error) { errs <- err })
	}
	timeout := time.After(60 * time.Second)
	for range events {
		select {
		case err := <-errs:
			if err != nil {
				tb.Fatalf("Append: %v", err)
			}
		case <-timeout:
			tb.Fatal("appends not stored in 60s")
		}
	}
}
