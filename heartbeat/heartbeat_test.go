package heartbeat

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// peer records the Wheel's calls; answer says whether it answers pings.
type peer struct {
	mu      sync.Mutex
	e       *Entry
	answer  bool
	pings   []time.Duration // since start
	expired []Reason
	at      time.Duration // of the first Expire
	start   time.Time
}

func (p *peer) Ping() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pings = append(p.pings, time.Since(p.start))
	if p.answer {
		p.e.Pong()
	}
}

func (p *peer) Expire(r Reason) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.expired) == 0 {
		p.at = time.Since(p.start)
	}
	p.expired = append(p.expired, r)
}

func (p *peer) snapshot() (pings []time.Duration, expired []Reason, at time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.pings...), append([]Reason(nil), p.expired...), p.at
}

func newWheel(t testing.TB, cfg Config) *Wheel {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	t.Cleanup(w.Close)
	return w
}

func add(w *Wheel, answer bool) *peer {
	p := &peer{answer: answer, start: time.Now()}
	p.mu.Lock()
	p.e = w.Add(p)
	p.mu.Unlock()
	return p
}

var cfg = Config{Interval: 30 * time.Second, PongTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}

func TestPingsEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWheel(t, cfg)
		p := add(w, true)
		for range 4 {
			time.Sleep(30 * time.Second)
			p.e.Touch() // keep it from idling
		}
		time.Sleep(time.Second)
		pings, expired, _ := p.snapshot()
		want := []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second, 120 * time.Second}
		if len(pings) != len(want) {
			t.Fatalf("pings at %v, want %v", pings, want)
		}
		for i := range want {
			if pings[i] < want[i] || pings[i] > want[i]+w.Config().Tick {
				t.Errorf("ping %d at %v, want %v (within a tick)", i, pings[i], want[i])
			}
		}
		if len(expired) != 0 {
			t.Errorf("expired %v, want nothing", expired)
		}
	})
}

func TestDeadPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWheel(t, cfg)
		alive := add(w, true)
		dead := add(w, false)
		time.Sleep(30*time.Second + 10*time.Second + 2*time.Second)
		alive.e.Touch()
		dead.e.Touch()
		_, expired, at := dead.snapshot()
		if len(expired) != 1 || expired[0] != Dead {
			t.Fatalf("unanswered peer expired %v, want [dead]", expired)
		}
		if at < 40*time.Second || at > 41*time.Second {
			t.Errorf("unanswered peer expired at %v, want 40s (ping at 30s + pong timeout 10s)", at)
		}
		if _, expired, _ := alive.snapshot(); len(expired) != 0 {
			t.Errorf("answering peer expired %v, want nothing", expired)
		}
		time.Sleep(2 * time.Minute)
		if _, expired, _ := dead.snapshot(); len(expired) != 1 {
			t.Errorf("dead peer expired %d times, want once", len(expired))
		}
	})
}

func TestIdle(t *testing.T) {
	tests := []struct {
		name string
		// script runs at start with the entry; the peer must expire idle at wantAt, or never
		// (wantAt 0) within 20 minutes.
		script func(e *Entry)
		wantAt time.Duration
	}{
		{"quiet", func(e *Entry) {}, 5 * time.Minute},
		{"touched at 4m", func(e *Entry) {
			time.Sleep(4 * time.Minute)
			e.Touch()
		}, 9 * time.Minute},
		{"turn running throughout", func(e *Entry) { e.TurnStarted() }, 0},
		{"turn ends at 12m", func(e *Entry) {
			e.TurnStarted()
			time.Sleep(12 * time.Minute)
			e.TurnEnded()
		}, 17 * time.Minute},
		{"two turns, one left running", func(e *Entry) {
			e.TurnStarted()
			e.TurnStarted()
			time.Sleep(time.Minute)
			e.TurnEnded()
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWheel(t, cfg)
				p := add(w, true)
				tt.script(p.e)
				time.Sleep(20*time.Minute - time.Since(p.start))
				_, expired, at := p.snapshot()
				if tt.wantAt == 0 {
					if len(expired) != 0 {
						t.Fatalf("expired %v at %v, want never", expired, at)
					}
					return
				}
				if len(expired) != 1 || expired[0] != Idle {
					t.Fatalf("expired %v, want [idle]", expired)
				}
				if at < tt.wantAt || at > tt.wantAt+w.Config().Tick {
					t.Errorf("idle at %v, want %v", at, tt.wantAt)
				}
			})
		})
	}
}

func TestRemoveStopsCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWheel(t, cfg)
		p := add(w, false)
		p.e.Remove()
		p.e.Remove()
		time.Sleep(10 * time.Minute)
		if pings, expired, _ := p.snapshot(); len(pings) != 0 || len(expired) != 0 {
			t.Errorf("removed entry got pings %v, expired %v, want nothing", pings, expired)
		}
	})
}

func TestConfig(t *testing.T) {
	tests := []struct {
		in      Config
		want    Config
		wantErr bool
	}{
		{Config{}, Config{Interval: 30 * time.Second, PongTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute, Tick: time.Second}, false},
		{Config{Interval: time.Second, PongTimeout: 400 * time.Millisecond, IdleTimeout: time.Minute},
			Config{Interval: time.Second, PongTimeout: 400 * time.Millisecond, IdleTimeout: time.Minute, Tick: 100 * time.Millisecond}, false},
		{Config{Interval: -1}, Config{}, true},
	}
	for _, tt := range tests {
		w, err := New(tt.in)
		if tt.wantErr {
			if err == nil {
				w.Close()
				t.Errorf("New(%+v) = nil error, want one", tt.in)
			}
			continue
		}
		if err != nil {
			t.Fatalf("New(%+v) = %v", tt.in, err)
		}
		if got := w.Config(); got != tt.want {
			t.Errorf("New(%+v).Config() = %+v, want %+v", tt.in, got, tt.want)
		}
		w.Close()
		w.Close()
	}
}

func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWheel(t, cfg)
		p := add(w, true)
		p.e.TurnStarted() // a producing turn does not hold off a deadline
		p.e.SetDeadline(time.Now().Add(3 * time.Second))
		time.Sleep(2 * time.Second)
		p.e.SetDeadline(time.Now().Add(10 * time.Second)) // extended at 2s: until 12s
		if got := p.e.Deadline(); !got.Equal(time.Now().Add(10 * time.Second)) {
			t.Errorf("Deadline() = %v, want %v", got, time.Now().Add(10*time.Second))
		}
		time.Sleep(9 * time.Second)
		if _, expired, _ := p.snapshot(); len(expired) != 0 {
			t.Fatalf("expired %v at 11s, want nothing before the extended deadline of 12s", expired)
		}
		time.Sleep(5 * time.Second)
		_, expired, at := p.snapshot()
		if len(expired) != 1 || expired[0] != Deadline || at < 12*time.Second || at > 12*time.Second+w.Config().Tick {
			t.Errorf("expired %v at %v, want [deadline] once within a tick of 12s", expired, at)
		}

		q := add(w, true)
		q.e.SetDeadline(time.Now().Add(time.Second))
		q.e.SetDeadline(time.Time{}) // removed
		time.Sleep(10 * time.Second)
		if _, expired, _ := q.snapshot(); len(expired) != 0 {
			t.Errorf("expired %v after its deadline was removed", expired)
		}
		p.e.Remove()
		q.e.Remove()
	})
}

// Sockets opened together are not pinged together: a tick sends at most its budget, the rest
// in the next ticks, and the wave stays spread in the intervals after; every socket is still
// pinged once an interval.
func TestPingsSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 3000
		w := newWheel(t, cfg)
		budget := w.pingBudget(n) // 200: twice the share of a 1 s tick in 30 s
		if budget != 200 {
			t.Fatalf("budget for %d entries = %d, want 200", n, budget)
		}
		peers := make([]*peer, n)
		for i := range peers {
			peers[i] = add(w, true)
		}
		for range 3 {
			time.Sleep(30 * time.Second)
			for _, p := range peers {
				p.e.Touch()
			}
		}
		time.Sleep(15 * time.Second)
		perTick := map[time.Duration]int{}
		for i, p := range peers {
			pings, expired, _ := p.snapshot()
			if len(expired) != 0 {
				t.Fatalf("peer %d expired %v", i, expired)
			}
			if len(pings) != 3 {
				t.Fatalf("peer %d pinged at %v, want 3 pings in 105 s", i, pings)
			}
			for k, at := range pings {
				if k > 0 && pings[k]-pings[k-1] != 30*time.Second {
					t.Errorf("peer %d pinged at %v: not one interval apart", i, pings)
				}
				perTick[at.Truncate(time.Second)]++
			}
			if pings[0] < 30*time.Second || pings[0] > 45*time.Second {
				t.Errorf("peer %d first pinged at %v, want within 30 s to 45 s", i, pings[0])
			}
		}
		for at, k := range perTick {
			if k > budget {
				t.Errorf("%d pings in the tick at %v, want at most %d", k, at, budget)
			}
		}
		if len(perTick) != 3*n/budget {
			t.Errorf("pings in %d ticks, want %d", len(perTick), 3*n/budget)
		}
	})
}
