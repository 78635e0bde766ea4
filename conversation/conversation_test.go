package conversation_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
)

func TestTurnOutcomes(t *testing.T) {
	e := newEnv(t, envOptions{memory: true})
	tests := []struct {
		name string
		sc   script
		want string
	}{
		{"complete", script{Tokens: 3}, tokenTurn(3)},
		{"agent loop with several RUN_FINISHED", script{Tokens: 1, Runs: 3},
			"CUSTOM:run.accepted" + strings.Repeat(" RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED", 3)},
		{"missing terminal", script{Tokens: 1, NoTerminal: true},
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_ERROR:incomplete"},
		{"agent error at start", script{Fail: "start"}, "CUSTOM:run.accepted RUN_ERROR:agent_error"},
		{"agent error midway", script{Tokens: 4, Fail: "middle"},
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR:agent_error"},
		{"protocol violation", script{Tokens: 4, Invalid: true},
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR:protocol_violation"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := fmt.Sprintf("outcome-%d", i)
			cl := dial(t, e.url(), "")
			cl.send(runFrame(runID, tt.sc))
			live := cl.untilN(t, len(strings.Fields(tt.want)))
			if got := summary(live); got != tt.want {
				t.Errorf("live = %s\nwant   %s", got, tt.want)
			}
			distinctOffsets(t, live)
			if live[0].Type != "CUSTOM" {
				t.Errorf("first frame %s, want the run.accepted marker", live[0].raw)
			}
			// The log holds exactly what was delivered, and ends closed: a resume from the
			// start replays it all and closes 1000.
			replay, end := e.resume(t, runID, "-1")
			if end.code != websocket.StatusNormalClosure {
				t.Errorf("resume closed %v, want 1000", end.err)
			}
			if got, want := strings.Join(raws(replay), "\n"), strings.Join(raws(live), "\n"); got != want {
				t.Errorf("resume from -1:\n%s\nwant what was delivered live:\n%s", got, want)
			}
			if tt.name == "protocol violation" {
				var ev struct{ Message string }
				json.Unmarshal(live[len(live)-1].Event, &ev)
				if !strings.Contains(ev.Message, "TEXT_MESSAGE_CONTENT") {
					t.Errorf("protocol_violation message %q does not carry the verifier's message", ev.Message)
				}
			}
			cl.expectQuiet(200 * time.Millisecond) // nothing after the terminal
		})
	}
}

// TestOverlappingTurns: two turns of one thread started on one socket run side by side
// (multitaskStrategy concurrent), their frames interleaved, each whole.
func TestOverlappingTurns(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(withStrategy(runFrame("a", script{Tokens: 5, IntervalMs: 20}), conversation.MultitaskConcurrent))
	cl.send(withStrategy(runFrame("b", script{Tokens: 5, IntervalMs: 20}), conversation.MultitaskConcurrent))
	perRun := map[string][]frame{}
	markers, terminals := 0, 0
	for terminals < 2 {
		f := cl.next(20 * time.Second)
		if f.err != nil {
			t.Fatalf("socket ended: %v", f.err)
		}
		var ev struct{ MessageID, RunID string }
		json.Unmarshal(f.Event, &ev)
		switch {
		case f.Type == "CUSTOM":
			markers++
		case ev.RunID != "":
			perRun[ev.RunID] = append(perRun[ev.RunID], f)
		default:
			perRun[strings.Split(ev.MessageID, "-")[1]] = append(perRun[strings.Split(ev.MessageID, "-")[1]], f)
		}
		if f.Type.Terminal() {
			terminals++
		}
	}
	if markers != 2 {
		t.Errorf("%d run.accepted markers, want 2", markers)
	}
	for _, id := range []string{"a", "b"} {
		got := "CUSTOM:run.accepted " + summary(perRun[id])
		if got != tokenTurn(5) {
			t.Errorf("turn %s = %s\nwant %s", id, got, tokenTurn(5))
		}
	}
}

func TestAbort(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("ab", script{Tokens: 2, Block: true}))
	live := cl.untilN(t, 5) // marker, RUN_STARTED, START, 2 deltas
	cl.send(abortFrame("ab"))
	e.waitClosed(t, "ab")
	replay, end := e.resume(t, "ab", "-1")
	want := "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR:aborted"
	if got := summary(replay); got != want || end.code != websocket.StatusNormalClosure {
		t.Fatalf("log = %s (close %v)\nwant %s", got, end.err, want)
	}
	var ev struct{ Message, Code string }
	json.Unmarshal(replay[len(replay)-1].Event, &ev)
	if ev.Message != "Request aborted" || ev.Code != "aborted" {
		t.Errorf("terminal = %s, want message Request aborted, code aborted", replay[len(replay)-1].Event)
	}
	if strings.Join(raws(replay[:5]), "\n") != strings.Join(raws(live), "\n") {
		t.Errorf("live frames differ from the log")
	}
	// The socket stays open and serves the next turn; nothing more of the aborted one.
	cl.send(runFrame("after", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("next turn = %s, want %s", got, tokenTurn(1))
	}
}

// untilN reads n frames.
func (cl *client) untilN(t testing.TB, n int) []frame {
	t.Helper()
	var out []frame
	for len(out) < n {
		f := cl.next(20 * time.Second)
		if f.err != nil {
			t.Fatalf("socket ended after %d frames: %v", len(out), f.err)
		}
		out = append(out, f)
	}
	return out
}

func TestEarlyAbort(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(abortFrame("early"))
	cl.send(runFrame("early", script{Tokens: 2}))
	e.waitClosed(t, "early")
	replay, _ := e.resume(t, "early", "-1")
	if got, want := summary(replay), "CUSTOM:run.accepted RUN_ERROR:aborted"; got != want {
		t.Errorf("log = %s, want %s (the agent never produced)", got, want)
	}
	// An abort for another runId does not touch this one.
	cl.send(abortFrame("other"))
	cl.send(runFrame("later", script{Tokens: 1}))
	live := cl.untilTerminal()
	if got := summary(live); got != tokenTurn(1) {
		t.Errorf("unrelated turn = %s, want %s", got, tokenTurn(1))
	}
}

func TestResubmit(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("re", script{Tokens: 1, Block: true}))
	cl.untilN(t, 4)
	cl.send(runFrame("re", script{Tokens: 2}))
	live := cl.untilTerminal()
	if got := summary(live); got != tokenTurn(2) {
		t.Errorf("after resubmit, live = %s\nwant %s (nothing more of the first turn)", got, tokenTurn(2))
	}
	replay, end := e.resume(t, "re", "-1")
	if got := strings.Join(raws(replay), "\n"); got != strings.Join(raws(live), "\n") || end.code != websocket.StatusNormalClosure {
		t.Errorf("log after resubmit = %s (close %v), want the second turn only", summary(replay), end.err)
	}
}

func TestInboundFrames(t *testing.T) {
	e := newEnv(t, envOptions{memory: true})
	cl := dial(t, e.url(), "")
	cl.send([]byte("this is not JSON"))
	if err := cl.c.Write(cl.ctx, websocket.MessageBinary, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	cl.send([]byte(`{"threadId":"t","runId":"bad","messages":[{"id":"1","role":"robot"}]}`))
	f := cl.next(10 * time.Second)
	if f.Kind != protocol.FrameEvent || f.Type != "RUN_ERROR" {
		t.Fatalf("answer to an invalid run frame = %s, want a bare RUN_ERROR", f.raw)
	}
	var ev struct{ Message, Code string }
	json.Unmarshal(f.Event, &ev)
	if ev.Code != "invalid_input" || !strings.Contains(ev.Message, "role") {
		t.Errorf("bare RUN_ERROR = %s, want code invalid_input and a message about the role", f.raw)
	}
	// The socket is still open and serves a turn.
	cl.send(runFrame("fine", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("turn = %s, want %s", got, tokenTurn(1))
	}
	if got := e.metric(t, "wsgateway_conversation_frames_dropped_total", "not_json"); got != 1 {
		t.Errorf("frames dropped as not JSON = %v, want 1", got)
	}
	if got := e.metric(t, "wsgateway_conversation_frames_dropped_total", "binary"); got != 1 {
		t.Errorf("binary frames dropped = %v, want 1", got)
	}
}

func TestForbidden(t *testing.T) {
	e := newEnv(t, envOptions{})
	owner := dial(t, e.url(), "p1")
	owner.send(runFrame("mine", script{Tokens: 1}))
	owner.untilTerminal()
	other := dial(t, e.url(), "p2")
	other.send(runFrame("mine", script{Tokens: 1}))
	f := other.next(10 * time.Second)
	var ev struct{ Code string }
	json.Unmarshal(f.Event, &ev)
	if f.Kind != protocol.FrameEvent || ev.Code != "forbidden" {
		t.Errorf("another principal's runId answered %s (%v), want a bare RUN_ERROR code forbidden", f.raw, f.err)
	}
	// Its resume is told the run does not exist.
	_, end := dial(t, e.url("runId", "mine", "offset", "-1"), "p2").untilClose()
	if end.code != conversation.StatusUnknownRun {
		t.Errorf("another principal's resume closed %v, want 4404", end.err)
	}
}

func TestTurnSurvivesSocket(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("survive", script{Tokens: 20, IntervalMs: 10}))
	first := cl.untilN(t, 4)
	cl.c.Close(websocket.StatusGoingAway, "tab closed")
	e.waitClosed(t, "survive")
	replay, end := e.resume(t, "survive", "-1")
	if got := summary(replay); got != tokenTurn(20) || end.code != websocket.StatusNormalClosure {
		t.Fatalf("log = %s (close %v)\nwant %s", got, end.err, tokenTurn(20))
	}
	if strings.Join(raws(replay[:4]), "\n") != strings.Join(raws(first), "\n") {
		t.Errorf("the log's first frames differ from those delivered live")
	}
	// Resuming from the last offset seen gets exactly the rest.
	rest, _ := e.resume(t, "survive", first[3].Offset)
	if got, want := strings.Join(raws(rest), "\n"), strings.Join(raws(replay[4:]), "\n"); got != want {
		t.Errorf("resume after %s:\n%s\nwant\n%s", first[3].Offset, got, want)
	}
}

func TestAbortOnDisconnect(t *testing.T) {
	e := newEnv(t, envOptions{abortOnDisconnect: true})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("dropped", script{Tokens: 2, Block: true}))
	cl.untilN(t, 5)
	cl.c.Close(websocket.StatusGoingAway, "tab closed")
	e.waitClosed(t, "dropped")
	replay, _ := e.resume(t, "dropped", "-1")
	want := "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR:aborted"
	if got := summary(replay); got != want {
		t.Errorf("log = %s\nwant %s", got, want)
	}
}

func TestResumeOffsets(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("r1", script{Tokens: 6}))
	all := cl.untilTerminal()
	for i := range all {
		got, end := e.resume(t, "r1", all[i].Offset)
		if strings.Join(raws(got), "\n") != strings.Join(raws(all[i+1:]), "\n") || end.code != websocket.StatusNormalClosure {
			t.Errorf("resume after frame %d = %s (close %v), want %s", i, summary(got), end.err, summary(all[i+1:]))
		}
	}
	if got, end := e.resume(t, "r1", "now"); len(got) != 0 || end.code != websocket.StatusNormalClosure {
		t.Errorf("resume from now of a closed log = %s (close %v), want nothing then 1000", summary(got), end.err)
	}
}

func TestResumeNowTails(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("tail", script{Tokens: 30, IntervalMs: 15}))
	cl.untilN(t, 3)
	tail := dial(t, e.url("runId", "tail", "offset", "now"), "")
	got, end := tail.untilClose()
	live := cl.untilTerminal()
	if end.code != websocket.StatusNormalClosure {
		t.Fatalf("tail closed %v, want 1000", end.err)
	}
	if len(got) == 0 || !got[len(got)-1].Type.Terminal() {
		t.Fatalf("tail from now = %s, want events up to the terminal", summary(got))
	}
	// What the tail got is a suffix of what the conversation socket got.
	all := append([]frame(nil), live...)
	suffix := strings.Join(raws(all[len(all)-len(got):]), "\n")
	if strings.Join(raws(got), "\n") != suffix {
		t.Errorf("tail = %s, want a suffix of the live stream", summary(got))
	}
}

func TestResumeRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("known", script{Tokens: 1}))
	known := cl.untilTerminal()
	cl.send(runFrame("other", script{Tokens: 1}))
	cl.untilTerminal()
	tests := []struct {
		name   string
		query  []string
		code   websocket.StatusCode
		reason string
	}{
		{"empty offset", []string{"runId", "known", "offset", ""}, websocket.StatusPolicyViolation, "no resume offset"},
		{"no runId", []string{"offset", "-1"}, websocket.StatusPolicyViolation, "invalid runId"},
		{"control character in runId", []string{"runId", "a\x01b", "offset", "-1"}, websocket.StatusPolicyViolation, "invalid runId"},
		{"offset with a space", []string{"runId", "known", "offset", "1 2"}, websocket.StatusPolicyViolation, "invalid offset"},
		{"malformed offset", []string{"runId", "known", "offset", "garbage"}, websocket.StatusPolicyViolation, "invalid offset"},
		{"offset of another run", []string{"runId", "other", "offset", known[1].Offset}, websocket.StatusPolicyViolation, "invalid offset"},
		{"unknown run", []string{"runId", "nobody", "offset", "now"}, conversation.StatusUnknownRun, "unknown or expired run"},
		{"unknown run joined", []string{"runId", "nobody", "offset", "-1"}, conversation.StatusUnknownRun, "unknown or expired run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, end := dial(t, e.url(tt.query...), "").untilClose()
			if len(got) != 0 || end.code != tt.code || end.reason != tt.reason {
				t.Errorf("resume %v = %d frames, close %v, want close %d %q", tt.query, len(got), end.err, tt.code, tt.reason)
			}
		})
	}
}

// failingReads is a Store whose reads fail as a NATS outage or a stream's leader election
// makes them fail: every read, or those before until (unix nanoseconds, when set).
type failingReads struct {
	conversation.Store
	until atomic.Int64
	reads atomic.Int32
}

func (f *failingReads) Read(ctx context.Context, principal, runID, after string) (conversation.LogReader, error) {
	f.reads.Add(1)
	if u := f.until.Load(); u == 0 || time.Now().UnixNano() < u {
		return nil, errors.New("read: nats: API error: code=503 err_code=10008 description=JetStream system temporarily unavailable")
	}
	return f.Store.Read(ctx, principal, runID, after)
}

// TestResumeFailed: a resume whose log cannot be opened for ReplayPatience closes 1011.
func TestResumeFailed(t *testing.T) {
	var fr failingReads
	const patience = 700 * time.Millisecond
	e := newEnv(t, envOptions{replayPatience: patience, wrap: func(s conversation.Store) conversation.Store {
		fr.Store = s
		return &fr
	}})
	start := time.Now()
	got, end := e.resume(t, "any", "-1")
	if len(got) != 0 || end.code != websocket.StatusInternalError || end.reason != "resume failed" {
		t.Errorf("resume with a failing store = %d frames, close %v; want 1011 resume failed", len(got), end.err)
	}
	if took := time.Since(start); took < patience {
		t.Errorf("the resume failed after %v, before the %v of patience", took, patience)
	}
	if n := fr.reads.Load(); n < 3 {
		t.Errorf("the log was opened %d times, want retries", n)
	}
	e.waitMetric(t, "wsgateway_conversation_resumes_total", "failed", 1)
}

// TestResumeWaitsOutElection: a resume sent while the log's stream answers 503 for 3 s (a
// leader election takes about that) gets the whole log once it answers again, by default.
func TestResumeWaitsOutElection(t *testing.T) {
	var fr failingReads
	e := newEnv(t, envOptions{wrap: func(s conversation.Store) conversation.Store {
		fr.Store = s
		return &fr
	}})
	fr.until.Store(1) // reads answer, until the resume
	cl := dial(t, e.url(), "")
	cl.send(runFrame("election", script{Tokens: 3}))
	live := cl.untilN(t, len(strings.Fields(tokenTurn(3))))
	fr.until.Store(time.Now().Add(3 * time.Second).UnixNano())
	replay, end := e.resume(t, "election", "-1")
	if end.code != websocket.StatusNormalClosure {
		t.Errorf("resume closed %v, want 1000 once the stream answered again", end.err)
	}
	if got, want := strings.Join(raws(replay), "\n"), strings.Join(raws(live), "\n"); got != want {
		t.Errorf("resume from -1:\n%s\nwant what was delivered live:\n%s", got, want)
	}
	if n := fr.reads.Load(); n < 2 {
		t.Errorf("the log was opened %d times, want it opened again after the failures", n)
	}
}

func TestResumeInboundIgnored(t *testing.T) {
	e := newEnv(t, envOptions{})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("ign", script{Tokens: 10, IntervalMs: 20}))
	cl.untilN(t, 2)
	rs := dial(t, e.url("runId", "ign", "offset", "-1"), "")
	rs.send(runFrame("sneaky", script{}))
	rs.send([]byte("junk"))
	got, end := rs.untilClose()
	if summary(got) != tokenTurn(10) || end.code != websocket.StatusNormalClosure {
		t.Errorf("resume = %s (close %v), want %s", summary(got), end.err, tokenTurn(10))
	}
}

func TestResumeOnAnotherGateway(t *testing.T) {
	a := newEnv(t, envOptions{})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL()})
	cl := dial(t, a.url(), "")
	cl.send(runFrame("cross", script{Tokens: 20, IntervalMs: 10}))
	first := cl.untilN(t, 5)
	cl.c.CloseNow() // the network dropped
	got, end := dial(t, b.url("runId", "cross", "offset", first[4].Offset), "").untilClose()
	if end.code != websocket.StatusNormalClosure {
		t.Fatalf("resume on the other gateway closed %v, want 1000", end.err)
	}
	all := append(first, got...)
	distinctOffsets(t, all)
	if s := summary(all); s != tokenTurn(20) {
		t.Errorf("first socket + resume elsewhere = %s\nwant %s", s, tokenTurn(20))
	}
}

// TestShutdown: a Shutdown drains the turn that ends within its context and stops the one
// that does not, both running when it starts (the gateway runs a thread's turns side by side:
// --multitask concurrent), and closes every socket 1012.
func TestShutdown(t *testing.T) {
	e := newEnv(t, envOptions{multitask: conversation.MultitaskConcurrent})
	short := dial(t, e.url(), "")
	short.send(runFrame("drains", script{Tokens: 10, IntervalMs: 30}))
	short.untilN(t, 3)
	long := dial(t, e.url(), "")
	long.send(runFrame("stuck", script{Tokens: 1, Block: true}))
	long.untilN(t, 3)
	resumer := dial(t, e.url("runId", "stuck", "offset", "-1"), "")

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.srv.Shutdown(ctx) }()
	for name, cl := range map[string]*client{"conversation": short, "blocked conversation": long, "resume": resumer} {
		_, end := cl.untilClose()
		if end.code != websocket.StatusServiceRestart || end.reason != "service restart" {
			t.Errorf("%s socket closed %v, want 1012 service restart", name, end.err)
		}
	}
	if err := <-done; err == nil {
		t.Errorf("Shutdown() = nil, want the context's error (a turn had to be stopped)")
	}
	// A turn that finished within the drain is complete; the stuck one ended with shutdown.
	for runID, want := range map[string]string{
		"drains": tokenTurn(10),
		"stuck":  "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT RUN_ERROR:shutdown",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		entries, closed, err := e.store.Snapshot(ctx, "p1", runID)
		cancel()
		if err != nil || !closed {
			t.Fatalf("Snapshot(%s) = closed %v, %v; want a closed log", runID, closed, err)
		}
		var frames []frame
		for _, en := range entries {
			sf, _ := protocol.DecodeServerFrame(protocol.AppendEnvelope(nil, en.Offset, en.Event))
			frames = append(frames, frame{ServerFrame: sf})
		}
		if got := summary(frames); got != want {
			t.Errorf("log of %s = %s\nwant %s", runID, got, want)
		}
	}
	// New sockets are refused.
	if _, _, err := websocket.Dial(context.Background(), e.url(), nil); err == nil {
		t.Errorf("Dial after Shutdown succeeded")
	}
}

func TestSlowConsumer(t *testing.T) {
	e := newEnv(t, envOptions{queueSize: 4})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("slow", script{Tokens: 300, DeltaBytes: 16 << 10}))
	// The client does not read while the turn produces 300 events of 16 KiB.
	e.waitClosed(t, "slow")
	got, end := cl.untilClose()
	if end.code != conversation.StatusSlowConsumer || end.reason != "slow consumer" {
		t.Fatalf("socket closed %v after %d frames, want 1013 slow consumer", end.err, len(got))
	}
	if len(got) == 0 {
		t.Fatalf("no frame before the slow-consumer close")
	}
	rest, _ := e.resume(t, "slow", got[len(got)-1].Offset)
	all := append(got, rest...)
	distinctOffsets(t, all)
	if s := summary(all); s != tokenTurn(300) {
		t.Errorf("live + resume = %d events, want the whole turn (%d)", len(all), 305)
	}
	if v := e.metric(t, "wsgateway_conversation_frames_dropped_total", "slow_consumer"); v != 1 {
		t.Errorf("slow_consumer drops = %v, want 1", v)
	}
}

// TestManyConversations runs 200 conversations at once, turns of one thread running side by
// side (--multitask concurrent); each drops its socket mid-turn and resumes once from its
// last offset. Every client must see its whole turn, once.
func TestManyConversations(t *testing.T) {
	const n = 200
	const tokens = 20
	// One principal: a socket and a resume each.
	e := newEnv(t, envOptions{maxSockets: 2 * n, multitask: conversation.MultitaskConcurrent})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- conversationWithResume(e, fmt.Sprintf("many-%d", i), tokens, 3+i%15)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// conversationWithResume runs one turn, drops the socket after cut frames, resumes from the
// last offset, and checks the whole sequence.
func conversationWithResume(e *env, runID string, tokens, cut int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.url(), nil)
	if err != nil {
		return fmt.Errorf("%s: dial: %w", runID, err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, runFrame(runID, script{Tokens: tokens, IntervalMs: 10})); err != nil {
		return fmt.Errorf("%s: %w", runID, err)
	}
	var frames []frame
	read := func(c *websocket.Conn) error {
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return err
			}
			sf, err := protocol.DecodeServerFrame(data)
			if err != nil {
				return err
			}
			if sf.Kind == protocol.FramePing {
				continue
			}
			frames = append(frames, frame{ServerFrame: sf, raw: string(data)})
			if len(frames) == cut {
				return nil
			}
		}
	}
	if err := read(c); err != nil {
		return fmt.Errorf("%s: live: %w", runID, err)
	}
	c.CloseNow()
	r, _, err := websocket.Dial(ctx, e.url("runId", runID, "offset", frames[len(frames)-1].Offset), nil)
	if err != nil {
		return fmt.Errorf("%s: dial resume: %w", runID, err)
	}
	defer r.CloseNow()
	if err := read(r); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		return fmt.Errorf("%s: resume ended %v, want 1000", runID, err)
	}
	seen := map[string]bool{}
	for _, f := range frames {
		if seen[f.Offset] {
			return fmt.Errorf("%s: offset %s twice", runID, f.Offset)
		}
		seen[f.Offset] = true
	}
	if got := summary(frames); got != tokenTurn(tokens) {
		return fmt.Errorf("%s: got %s\nwant %s", runID, got, tokenTurn(tokens))
	}
	return nil
}

// TestAbortFromAnotherGateway: an abort frame on a socket of another gateway sharing the
// store stops the turn; another principal's abort changes nothing.
func TestAbortFromAnotherGateway(t *testing.T) {
	a := newEnv(t, envOptions{})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL()})
	owner := dial(t, a.url(), "")
	owner.send(runFrame("far", script{Tokens: 1000, IntervalMs: 10}))
	owner.untilN(t, 4)

	intruder := dial(t, b.url(), "p2")
	intruder.send(abortFrame("far"))
	// The turn goes on: 36 more deltas, 10 ms apart, give the request time to arrive.
	if got := summary(owner.untilN(t, 40)); strings.Contains(got, "RUN_ERROR") {
		t.Fatalf("after another principal's abort the socket got %s", got)
	}

	other := dial(t, b.url(), "")
	start := time.Now()
	other.send(abortFrame("far"))
	a.waitClosed(t, "far")
	t.Logf("abort from the other gateway: the log closed %v after the abort frame", time.Since(start).Round(time.Millisecond))
	replay, end := b.resume(t, "far", "-1")
	if got := summary(replay[len(replay)-1:]); got != "RUN_ERROR:aborted" || end.code != websocket.StatusNormalClosure {
		t.Fatalf("log ends %s (close %v), want RUN_ERROR:aborted", got, end.err)
	}
	if n := len(replay); n > 900 {
		t.Errorf("the log holds %d events: the turn ran to its end instead of being aborted", n)
	}
}

// TestAbortOfALongRun: POST /api/runs/{runId}/abort of a run whose log holds megabytes answers
// its outcome from what is stored after the request (the last batch stored before it, which
// its reader starts in, then the terminal), and again once the run ended, from one batch: the
// gateway that answers reads at most a batch of NATS, not the log.
func TestAbortOfALongRun(t *testing.T) {
	a := newEnv(t, envOptions{})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL()})
	owner := dial(t, a.url(), "")
	const tokens, deltaBytes = 5000, 400
	owner.send(runFrame("long", script{Tokens: tokens, DeltaBytes: deltaBytes, Block: true}))
	owner.untilN(t, 3+tokens) // marker, RUN_STARTED, START and every delta: all stored
	const logBytes = tokens * deltaBytes
	// The terminal and the close record, or one small batch, and NATS's chatter; and, for the
	// running run, the batch its reader starts in, which the writer fills up to the store's
	// MaxBatchBytes (512 KiB) while NATS acks slowly (a busy machine: 116 KB were seen).
	const chatter, batch = 64 << 10, 512 << 10
	bounds := map[string]uint64{"running": chatter + batch, "ended": chatter}
	read := func(runID string) (string, uint64) {
		before := b.store.Conn().Stats().InBytes
		status, body := b.abortHTTP(t, runID, "")
		if status != http.StatusOK {
			t.Fatalf("abort of %s = %d %s", runID, status, body)
		}
		return body, b.store.Conn().Stats().InBytes - before
	}
	for _, step := range []string{"running", "ended"} {
		body, n := read("long")
		t.Logf("abort of the %s run: %s, %d bytes read from NATS (log: over %d bytes)", step, body, n, logBytes)
		if want := `{"runId":"long","outcome":"aborted"}`; body != want {
			t.Errorf("abort of the %s run = %s, want %s", step, body, want)
		}
		if n > bounds[step] {
			t.Errorf("abort of the %s run read %d bytes from NATS, want at most %d: the log holds over %d", step, n, bounds[step], logBytes)
		}
	}
}

// abortHTTP posts an abort request for runID as principal and returns the status and body.
func (e *env) abortHTTP(t testing.TB, runID, principal string) (int, string) {
	t.Helper()
	h := http.Header{}
	if principal != "" {
		h.Set("X-Principal", principal)
	}
	resp := e.httpDo(t, http.MethodPost, "/api/runs/"+url.PathEscape(runID)+"/abort", nil, h)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// TestAbortHTTP: POST /api/runs/{runId}/abort on another gateway stops a running turn and
// answers once its terminal is stored; it is idempotent, answers a finished run's outcome,
// and 404 for an unknown run or another principal's, which it leaves alone.
func TestAbortHTTP(t *testing.T) {
	a := newEnv(t, envOptions{})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL()})
	owner := dial(t, a.url(), "")
	owner.send(runFrame("stop-me", script{Tokens: 1000, IntervalMs: 10}))
	owner.untilN(t, 4)

	if status, body := b.abortHTTP(t, "stop-me", "p2"); status != http.StatusNotFound || body != `{"error":"unknown or expired run"}` {
		t.Errorf("another principal's abort = %d %s, want 404 unknown or expired run", status, body)
	}
	if got := summary(owner.untilN(t, 40)); strings.Contains(got, "RUN_ERROR") {
		t.Fatalf("after another principal's abort the socket got %s", got)
	}
	start := time.Now()
	status, body := b.abortHTTP(t, "stop-me", "")
	t.Logf("HTTP abort through the other gateway answered in %v", time.Since(start).Round(time.Millisecond))
	if want := `{"runId":"stop-me","outcome":"aborted"}`; status != http.StatusOK || body != want {
		t.Fatalf("abort = %d %s, want 200 %s", status, body, want)
	}
	replay, _ := a.resume(t, "stop-me", "-1")
	if got := summary(replay[len(replay)-1:]); got != "RUN_ERROR:aborted" {
		t.Errorf("log ends %s, want RUN_ERROR:aborted", got)
	}
	if status, body := a.abortHTTP(t, "stop-me", ""); status != http.StatusOK || !strings.Contains(body, `"outcome":"aborted"`) {
		t.Errorf("second abort = %d %s, want 200 aborted again", status, body)
	}

	owner.send(runFrame("done", script{Tokens: 2}))
	a.waitClosed(t, "done")
	if status, body := b.abortHTTP(t, "done", ""); status != http.StatusOK || body != `{"runId":"done","outcome":"finished"}` {
		t.Errorf("abort of a finished run = %d %s, want 200 finished", status, body)
	}
	if status, _ := b.abortHTTP(t, "no-such-run", ""); status != http.StatusNotFound {
		t.Errorf("abort of an unknown run = %d, want 404", status)
	}
}
