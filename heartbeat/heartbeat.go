// Package heartbeat drives the pings, dead-peer detection and idle timeouts of many sockets
// from one shared ticker.
//
// A Wheel owns one goroutine and one ticker for every socket it watches, so an idle socket
// costs one small Entry and no goroutine, timer or buffer of its own. Each tick the Wheel
// visits its entries and, for each:
//
//   - calls Peer.Ping every Config.Interval (the peer sends its {"type":"ping"} frame and a
//     WebSocket protocol ping, and reports the pong with Entry.Pong), a ping due in a tick
//     that already sent its share deferred to the next (see pingBudget);
//   - calls Peer.Expire(Dead) when a ping has gone unanswered for Config.PongTimeout;
//   - calls Peer.Expire(Idle) when no activity (Entry.Touch) happened for Config.IdleTimeout
//     and no turn of the socket is still producing (Entry.TurnStarted / Entry.TurnEnded). The
//     end of a turn counts as activity, so a client gets a full idle period to read a result.
//   - calls Peer.Expire(Deadline) once the Entry's deadline (Entry.SetDeadline: the expiry
//     of the socket's credentials) has passed, busy or not, within one tick of it.
//
// Peer methods are called from the Wheel's goroutine and must not block. Expire is called at
// most once per Entry. Times are read from the time package, so tests run under
// testing/synctest.
package heartbeat

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config's zero fields.
const (
	DefaultInterval    = 30 * time.Second
	DefaultPongTimeout = 10 * time.Second
	DefaultIdleTimeout = 5 * time.Minute
	maxTick            = time.Second
)

// Spreading the pings. Sockets opened together (every client of a restarted gateway
// reconnecting, a load test dialing) would be pinged together every interval: each ping costs
// the gateway a write of the heartbeat frame, one of the protocol ping, a goroutine waiting for
// the pong and a wake of the socket's reader, about 100 µs of CPU, so 10,000 sockets opened
// within a few seconds took a few hundred milliseconds of both cores in each of a few ticks
// every 30 s, and the first events of the turns started in those ticks waited behind them. A
// tick sends at most pingSpread times its share of an interval's pings (the entries times the
// tick over the interval), and never fewer than minPingBudget: the pings due beyond it go out in
// the next ticks, and a wave of aligned sockets spreads over about half the interval, where it
// stays. A deferred ping is later by at most that spread, and so is a dead peer's detection.
const (
	pingSpread    = 2
	minPingBudget = 100
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("heartbeat: invalid config")

// Reason says why a Peer expired. The zero value is invalid.
type Reason int

// Reasons of Peer.Expire.
const (
	Idle     Reason = iota + 1 // no activity and no producing turn for the idle timeout
	Dead                       // a ping went unanswered for the pong timeout
	Deadline                   // the deadline set with Entry.SetDeadline passed
)

func (r Reason) String() string {
	switch r {
	case Idle:
		return "idle"
	case Dead:
		return "dead"
	case Deadline:
		return "deadline"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Config configures a Wheel. Zero fields mean the documented defaults.
type Config struct {
	Interval    time.Duration // between pings; default 30s
	PongTimeout time.Duration // to answer a ping; default 10s
	IdleTimeout time.Duration // without activity and producing turns; default 5m
	// Tick is the resolution of the shared ticker; default the smallest of 1s and a quarter of
	// the three durations above.
	Tick time.Duration
}

// Peer is the socket side of an Entry. Its methods must not block, and must not call the
// Entry's Remove (the Wheel holds its lock while it calls them).
type Peer interface {
	// Ping sends the heartbeat frame and a protocol ping, reporting its pong with Entry.Pong.
	Ping()
	// Expire closes the socket for reason r.
	Expire(r Reason)
}

// Wheel watches entries from one goroutine. It is safe for concurrent use.
type Wheel struct {
	cfg     Config
	mu      sync.Mutex
	entries map[*Entry]struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// Entry is one watched socket.
type Entry struct {
	w      *Wheel
	peer   Peer
	active atomic.Int64 // unix nanoseconds of the last activity
	busy   atomic.Int32 // producing turns
	pong   atomic.Bool  // the outstanding ping was answered
	// deadline is the unix nanoseconds after which the peer expires; 0: none.
	deadline atomic.Int64
	// Guarded by w.mu.
	nextPing time.Time
	pingAt   time.Time // zero: no ping outstanding
	expired  bool
}

// New starts a Wheel. Close stops it.
func New(cfg Config) (*Wheel, error) {
	if cfg.Interval < 0 || cfg.PongTimeout < 0 || cfg.IdleTimeout < 0 || cfg.Tick < 0 {
		return nil, fmt.Errorf("%w: negative duration", ErrConfig)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.PongTimeout == 0 {
		cfg.PongTimeout = DefaultPongTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Tick == 0 {
		cfg.Tick = min(maxTick, cfg.Interval/4, cfg.PongTimeout/4, cfg.IdleTimeout/4)
		if cfg.Tick <= 0 {
			cfg.Tick = time.Millisecond
		}
	}
	w := &Wheel{
		cfg:     cfg,
		entries: make(map[*Entry]struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go w.run()
	return w, nil
}

// Config returns the Wheel's configuration with defaults applied.
func (w *Wheel) Config() Config { return w.cfg }

// Close stops the Wheel and waits for its goroutine. Entries are no longer visited. It is
// idempotent.
func (w *Wheel) Close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// Add watches p. The first ping is due one interval from now, and so is the idle check.
func (w *Wheel) Add(p Peer) *Entry {
	now := time.Now()
	e := &Entry{w: w, peer: p, nextPing: now.Add(w.cfg.Interval)}
	e.active.Store(now.UnixNano())
	w.mu.Lock()
	w.entries[e] = struct{}{}
	w.mu.Unlock()
	return e
}

// Remove stops watching e. It is idempotent.
func (e *Entry) Remove() {
	e.w.mu.Lock()
	delete(e.w.entries, e)
	e.w.mu.Unlock()
}

// Touch records activity (an inbound text frame): it restarts the idle period.
func (e *Entry) Touch() { e.active.Store(time.Now().UnixNano()) }

// SetDeadline makes the Wheel expire the peer (Deadline) once t has passed; the zero time
// removes the deadline. It costs the Entry no timer: the Wheel's tick checks it.
func (e *Entry) SetDeadline(t time.Time) {
	var d int64
	if !t.IsZero() {
		d = max(t.UnixNano(), 1)
	}
	e.deadline.Store(d)
}

// Deadline returns the deadline set with SetDeadline; the zero time if none.
func (e *Entry) Deadline() time.Time {
	if d := e.deadline.Load(); d != 0 {
		return time.Unix(0, d)
	}
	return time.Time{}
}

// Pong records the answer to the outstanding ping.
func (e *Entry) Pong() { e.pong.Store(true) }

// TurnStarted records a producing turn: the socket does not idle out until it ends.
func (e *Entry) TurnStarted() { e.busy.Add(1) }

// TurnEnded records the end of a turn started with TurnStarted; it counts as activity.
func (e *Entry) TurnEnded() {
	e.Touch()
	e.busy.Add(-1)
}

func (w *Wheel) run() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case now := <-t.C:
			w.sweep(now)
		}
	}
}

// pingBudget returns the most pings a tick sends when the Wheel watches n entries.
func (w *Wheel) pingBudget(n int) int {
	share := (int64(n)*int64(w.cfg.Tick)*pingSpread + int64(w.cfg.Interval) - 1) / int64(w.cfg.Interval)
	return max(minPingBudget, int(share))
}

// sweep visits every entry once. Peer calls happen under w.mu, which is why they must not
// block; in exchange an Entry removed by Remove is never called afterwards.
func (w *Wheel) sweep(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	budget := w.pingBudget(len(w.entries))
	for e := range w.entries {
		if e.expired {
			continue
		}
		if d := e.deadline.Load(); d != 0 && now.UnixNano() >= d {
			e.expired = true
			e.peer.Expire(Deadline)
			continue
		}
		if !e.pingAt.IsZero() {
			if e.pong.Load() {
				e.pingAt = time.Time{}
			} else if now.Sub(e.pingAt) >= w.cfg.PongTimeout {
				e.expired = true
				e.peer.Expire(Dead)
				continue
			}
		}
		if e.busy.Load() == 0 && now.Sub(time.Unix(0, e.active.Load())) >= w.cfg.IdleTimeout {
			e.expired = true
			e.peer.Expire(Idle)
			continue
		}
		if !now.Before(e.nextPing) && budget > 0 {
			budget--
			e.nextPing = now.Add(w.cfg.Interval)
			if e.pingAt.IsZero() {
				e.pingAt = now
				e.pong.Store(false)
			}
			e.peer.Ping()
		}
	}
}
