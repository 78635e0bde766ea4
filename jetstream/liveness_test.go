package jetstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/jetstream/lease"
)

// TestLivenessCostsPerStore: many open runs on two stores cost the lease bucket one write
// per store and renewal period, not one per run; when one store's process dies (its
// connection cut, nothing released), all its runs end producer_lost together, within the
// lease TTL plus a reaper's pass, while the other store's runs stay open and writable.
func TestLivenessCostsPerStore(t *testing.T) {
	const runs = 200 // per store
	cfg := testConfig(t)
	cfg.LeaseTTL = 3 * time.Second // renewals every 600ms; a busy machine can delay one by a second
	cfg.ReapInterval = 250 * time.Millisecond
	a := openStore(t, cfg) // runs the embedded server; its runs survive
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg) // the store whose process dies
	ctx := context.Background()

	open := func(s *Store, prefix string) []*Writer {
		ws := make([]*Writer, runs)
		var wg sync.WaitGroup
		errs := make(chan error, runs)
		for i := range ws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := s.Create(ctx, "alice", fmt.Sprintf("%s-%d", prefix, i), "t")
				if err != nil {
					errs <- err
					return
				}
				ws[i] = w
				mustAppend(t, w, [][]byte{event(prefix, i)})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return ws
	}
	survivors, doomed := open(a, "a"), open(b, "b")

	leaseWrites := func() uint64 {
		st, err := a.js.Stream(ctx, "KV_"+a.cfg.LeaseBucket)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.LastSeq
	}
	const periods = 10
	before := leaseWrites()
	time.Sleep(periods * lease.RenewInterval(a.cfg.LeaseTTL))
	writes := leaseWrites() - before
	t.Logf("lease bucket writes over %d renewal periods with %d open runs on 2 stores: %d", periods, 2*runs, writes)
	if writes > 2*(periods+2) {
		t.Fatalf("%d lease writes over %d periods: renewal grows with the runs (%d), not the stores (2)", writes, periods, 2*runs)
	}
	for _, w := range append(survivors, doomed...) {
		select {
		case <-w.Lost():
			t.Fatalf("run %s lost while its store renewed: %v", w.Info().RunID, w.Err())
		default:
		}
	}

	b.lnc.Close() // the process dies: no renewal, no release, no close
	b.nc.Close()
	died := time.Now()
	deadline := died.Add(cfg.LeaseTTL + 15*time.Second)
	for i := range runs {
		for {
			info, err := a.Run(ctx, "alice", fmt.Sprintf("b-%d", i))
			if err == nil && info.State == RunClosed {
				if !info.Reaped {
					t.Fatalf("run b-%d closed but not reaped: %+v", i, info)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run b-%d still %v %v after the producer's store died", i, info.State, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("the %d runs of the dead store were all reaped %v after it died (lease TTL %v)", runs, time.Since(died).Round(time.Millisecond), cfg.LeaseTTL)
	for i := range runs {
		entries, closed, err := a.Snapshot(ctx, "alice", fmt.Sprintf("b-%d", i))
		if err != nil || !closed || len(entries) != 2 || string(entries[1].Event) != string(ProducerLost) {
			t.Fatalf("log of b-%d = %d entries, closed %v, %v; want its event then producer_lost", i, len(entries), closed, err)
		}
	}
	for i, w := range survivors {
		mustAppend(t, w, [][]byte{event("a", runs+i)})
		if err := w.Close(ctx); err != nil {
			t.Fatalf("Close of a live store's run a-%d: %v", i, err)
		}
	}
}
