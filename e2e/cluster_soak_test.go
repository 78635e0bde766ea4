package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

var soakDuration = flag.Duration("soak", 0, "run TestSoak for this long (e.g. 5m) instead of its short CI version")

// Soak parameters: the CI version runs shortSoak; -soak sets the duration of the long one.
const (
	soakConversations = 100
	shortSoak         = 60 * time.Second
	// soakDropChance is the chance that a socket carrying a turn is dropped at a random event.
	soakDropChance = 0.35
	// soakJoinEvery: every so many turns of a conversation, a joiner on the other gateway reads
	// the whole log and compares it with what the client assembled.
	soakJoinEvery = 5
	// soakKillEvery: so often one of the gateways is killed (kill -9) and started again.
	soakKillEvery = 10 * time.Second
)

// soakStats are the figures of a soak.
type soakStats struct {
	turns, events, drops, resumes, joins, lost, duplicated, failures atomic.Int64
	// kills counts the gateways killed; broken the sockets that ended without the client
	// dropping them (their gateway died); resent the turns sent again because the gateway
	// died before it created their log.
	kills, broken, resent atomic.Int64
}

// statusUnknownRun is the close of a resume socket whose run has no log (PROTOCOL.md).
const statusUnknownRun websocket.StatusCode = 4404

// fleet is the soak's gateways, one replaced by a new process at each kill.
type fleet struct {
	mu  sync.Mutex
	gws []*gateway
}

func (f *fleet) pick(rng *rand.Rand) *gateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gws[rng.IntN(len(f.gws))]
}

// dial opens a socket at url(gw) on a gateway picked at random, again on another pick while
// the one picked refuses (it was just killed), for up to 10 s.
func (f *fleet) dial(ctx context.Context, rng *rand.Rand, url func(*gateway) string) (*websocket.Conn, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dialWS(ctx, url(f.pick(rng)))
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return c, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSoak runs soakConversations conversations across both gateways of the scale-out
// topology, each sending turns one after another, for shortSoak (or -soak), while every
// soakKillEvery one of the gateways is killed (kill -9) and started again. A conversation
// keeps one socket, opened on either gateway; at random events its socket (or a resume
// socket) drops, or its gateway dies, and the client resumes on either live gateway from the
// last offset it received, as the reference client does; a turn sent to a gateway that died
// before it created the turn's log is sent again. The turns of a killed gateway are taken
// over by the other (--takeover, on for the demo agent). Every turn must reach the client
// complete (RUN_FINISHED), in order and without a duplicate; the closing note gives the
// numbers of turns, drops, kills, resumes, and of lost and duplicated events, which must be
// zero.
func TestSoak(t *testing.T) {
	d := shortSoak
	if *soakDuration > 0 {
		d = *soakDuration
	}
	extra := []string{"--log-level", "info", "--lease-ttl", "3s"}
	top := startTopology(t, extra...)
	fl := &fleet{gws: []*gateway{top.A, top.B}}
	ctx, cancel := context.WithTimeout(context.Background(), d+90*time.Second)
	defer cancel()
	deadline := time.Now().Add(d)
	var st soakStats
	var wg sync.WaitGroup
	for i := range soakConversations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			soakConversation(t, ctx, fl, i, deadline, &st)
		}()
	}
	// The chaos: one gateway after the other killed and started again, while turns stream.
	args := append(append(composeGatewayFlags(t), "--nats-url", top.NATS.URLs), extra...)
	for k := 0; time.Until(deadline) > soakKillEvery; k++ {
		time.Sleep(soakKillEvery)
		fl.mu.Lock()
		victim := fl.gws[k%2]
		fl.mu.Unlock()
		victim.signal(t, syscall.SIGKILL)
		victim.wait(t, 10*time.Second)
		st.kills.Add(1)
		g := startGateway(t, args...)
		fl.mu.Lock()
		fl.gws[k%2] = g
		fl.mu.Unlock()
	}
	wg.Wait()
	t.Logf("soak: %d conversations for %v on 2 gateways and 3 NATS nodes, %d gateways killed and started again: %d turns, %d events, %d socket drops (%d by a gateway's death), %d resumes, %d turns sent again, %d joins compared with the client, %d lost events, %d duplicated events, %d failures",
		soakConversations, d, st.kills.Load(), st.turns.Load(), st.events.Load(), st.drops.Load(), st.broken.Load(), st.resumes.Load(),
		st.resent.Load(), st.joins.Load(), st.lost.Load(), st.duplicated.Load(), st.failures.Load())
	if st.lost.Load() != 0 || st.duplicated.Load() != 0 || st.failures.Load() != 0 {
		t.Errorf("soak: %d lost events, %d duplicated events, %d failures; want none", st.lost.Load(), st.duplicated.Load(), st.failures.Load())
	}
	if st.turns.Load() < soakConversations || st.drops.Load() == 0 || st.resumes.Load() == 0 || st.kills.Load() == 0 {
		t.Errorf("soak: %d turns, %d drops, %d resumes, %d kills: the soak did not exercise what it should",
			st.turns.Load(), st.drops.Load(), st.resumes.Load(), st.kills.Load())
	}
}

// soakConversation runs the turns of conversation i until deadline.
func soakConversation(t *testing.T, ctx context.Context, fl *fleet, i int, deadline time.Time, st *soakStats) {
	rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
	fail := func(format string, args ...any) {
		st.failures.Add(1)
		t.Errorf("conversation %d: "+format, append([]any{i}, args...)...)
	}
	var conv *websocket.Conn
	defer func() {
		if conv != nil {
			conv.Close(websocket.StatusNormalClosure, "")
		}
	}()
	for turn := 0; time.Now().Before(deadline) && ctx.Err() == nil; turn++ {
		if conv == nil {
			c, err := fl.dial(ctx, rng, func(g *gateway) string { return g.WS })
			if err != nil {
				fail("dial: %v", err)
				return
			}
			conv = c
		}
		tokens := 10 + rng.IntN(50)
		runID := fmt.Sprintf("soak-%03d-%04d", i, turn)
		opts := fmt.Sprintf(`{"tokens":%d,"intervalMs":%d}`, tokens, 30+rng.IntN(40))
		if err := conv.Write(ctx, websocket.MessageText, demoRunFrame(runID, opts)); err != nil {
			conv.CloseNow() // its gateway died while the conversation was idle: reconnect
			conv = nil
			st.broken.Add(1)
			turn--
			continue
		}
		total := len(demoTurn(tokens))
		tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		got, dropped, err := soakFollow(tctx, conv, total, rng, st)
		if dropped {
			conv = nil
		}
		resend := false
		// Resume (on either gateway) until the log's close, dropping again at random.
		for err == nil && !complete(got, total) {
			if !dropped {
				err = errors.New("a resume socket closed 1000 before the turn's end")
				break
			}
			st.drops.Add(1)
			st.resumes.Add(1)
			f := &follower{runID: runID, got: got}
			c, derr := fl.dial(tctx, rng, func(g *gateway) string { return resumeURL(g, runID, f.last()) })
			if derr != nil {
				err = derr
				break
			}
			var more []envelope
			more, dropped, err = soakFollow(tctx, c, total-len(got), rng, st)
			if len(got) == 0 && websocket.CloseStatus(err) == statusUnknownRun {
				// The gateway died before it created the turn's log: the send was lost with
				// it, and the client sends the turn again.
				resend, err = true, nil
				c.CloseNow()
				break
			}
			got = append(got, more...)
			if !dropped {
				c.CloseNow()
			}
		}
		cancel()
		if resend {
			st.resent.Add(1)
			turn--
			continue
		}
		if err != nil {
			fail("turn %s: %v after %d of %d events", runID, err, len(got), total)
			return
		}
		st.turns.Add(1)
		st.events.Add(int64(len(got)))
		lost, dup := countLostDuplicated(got, demoTurn(tokens))
		st.lost.Add(int64(lost))
		st.duplicated.Add(int64(dup))
		if lost+dup > 0 {
			t.Errorf("conversation %d, turn %s: %d lost and %d duplicated events: %v", i, runID, lost, dup, got)
		}
		if turn%soakJoinEvery == 0 {
			st.joins.Add(1)
			if err := sameAsLog(ctx, fl, rng, runID, got); err != nil {
				fail("turn %s: %v", runID, err)
			}
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	}
}

// complete reports whether a turn of total events has fully arrived.
func complete(got []envelope, total int) bool {
	return len(got) >= total && got[len(got)-1].Type == "RUN_FINISHED"
}

// soakFollow reads a socket carrying a turn until the turn's last event (a conversation
// socket) or the log's close (a resume socket), or until a drop chosen at random: it then
// closes the socket without a close handshake. It returns what arrived and whether it dropped
// the socket; an error is a socket that failed by itself, or a turn that ended otherwise than
// RUN_FINISHED.
func soakFollow(ctx context.Context, c *websocket.Conn, remaining int, rng *rand.Rand, st *soakStats) ([]envelope, bool, error) {
	dropAt := -1
	if remaining > 1 && rng.Float64() < soakDropChance {
		dropAt = rng.IntN(remaining)
	}
	var got []envelope
	for {
		if len(got) == dropAt {
			c.CloseNow()
			return got, true, nil
		}
		_, data, err := c.Read(ctx)
		if err != nil {
			switch code := websocket.CloseStatus(err); {
			case code == websocket.StatusNormalClosure:
				return got, false, nil
			case code == statusUnknownRun || ctx.Err() != nil:
				return got, false, err
			}
			// The socket broke without a close of the gateway's choosing: its gateway died
			// (or closed it 1012 "run moved"). The client resumes, as after its own drop.
			st.broken.Add(1)
			return got, true, nil
		}
		e, ok := parseFrame(data)
		if !ok {
			continue
		}
		got = append(got, e)
		switch {
		case e.Type == "RUN_ERROR":
			return got, false, fmt.Errorf("RUN_ERROR %s: %s", e.Code, e.Message)
		case e.Type == "RUN_FINISHED" && len(got) == remaining:
			return got, false, nil // the conversation socket stays open for the next turn
		}
	}
}

// countLostDuplicated compares what a client assembled with the complete turn: duplicated
// counts events whose offset arrived before (or out of order), lost the events of the turn
// missing from what remains.
func countLostDuplicated(got []envelope, want []string) (lost, duplicated int) {
	var uniq []string
	last := ""
	for _, e := range got {
		if e.ID == "" || e.ID <= last {
			duplicated++
			continue
		}
		last = e.ID
		uniq = append(uniq, e.key())
	}
	// The longest common subsequence is what arrived in order; with no reordering (checked
	// above) a walk finds it.
	j := 0
	for _, k := range uniq {
		if j < len(want) && k == want[j] {
			j++
		} else {
			duplicated++ // an event the turn does not have at this place
		}
	}
	return len(want) - j, duplicated
}

// sameAsLog joins runID on a gateway of fl and compares the log with what the client
// assembled.
func sameAsLog(ctx context.Context, fl *fleet, rng *rand.Rand, runID string, got []envelope) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var log []envelope
	for {
		c, err := fl.dial(ctx, rng, func(g *gateway) string { return resumeURL(g, runID, "-1") })
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		var status websocket.StatusCode
		log, status, err = readFrames(ctx, c, nil)
		c.CloseNow()
		if status == websocket.StatusNormalClosure {
			break
		}
		if status != -1 || ctx.Err() != nil {
			return fmt.Errorf("join closed %v (%w) after %d events", status, err, len(log))
		}
		// The join's gateway died under it (a close without a close frame): join again.
	}
	if len(log) != len(got) {
		return fmt.Errorf("the log holds %d events, the client assembled %d", len(log), len(got))
	}
	var diff []string
	for i := range log {
		if log[i] != got[i] {
			diff = append(diff, fmt.Sprintf("%d: log %+v, client %+v", i, log[i], got[i]))
		}
	}
	if len(diff) > 0 {
		return errors.New("the log differs from the client: " + strings.Join(diff, "; "))
	}
	return nil
}
