package conversation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
)

// threadRunFrame is a run frame of the test agent for runID in thread threadID, posting a new
// user message of its own (a new turn, not a regenerate).
func threadRunFrame(threadID, runID string, sc script) []byte {
	b, _ := json.Marshal(map[string]any{
		"threadId":       threadID,
		"runId":          runID,
		"messages":       []any{map[string]any{"id": "u-" + runID, "role": "user", "content": "hello"}},
		"forwardedProps": map[string]any{"test": sc},
	})
	return b
}

func followFrame(kind, threadID string) []byte {
	return []byte(fmt.Sprintf(`{"type":%q,"threadId":%q}`, kind, threadID))
}

// handled waits until cl's socket handled the frames sent before: frames are handled in order,
// and a follow frame without a threadId is answered.
func handled(t testing.TB, cl *client) {
	t.Helper()
	cl.send([]byte(`{"type":"follow"}`))
	if f := cl.next(10 * time.Second); f.Kind != protocol.FrameEvent || !strings.Contains(f.raw, "invalid_input") {
		t.Fatalf("answer to an invalid follow frame: %s (%v)", f.raw, f.err)
	}
}

// runOf returns the runId field of an envelope, "" for none.
func runOf(f frame) string {
	var v struct {
		RunID string `json:"runId"`
	}
	json.Unmarshal([]byte(f.raw), &v)
	return v.RunID
}

// followed reads cl until every run of want has delivered its terminal, and returns the
// frames of each run (by runId). A frame that is not an envelope naming one of them fails
// the test.
func followed(t testing.TB, cl *client, want ...string) map[string][]frame {
	t.Helper()
	runs := map[string][]frame{}
	ended := 0
	for ended < len(want) {
		f := cl.next(30 * time.Second)
		if f.err != nil {
			t.Fatalf("socket ended before every followed run ended (%d of %d): %v", ended, len(want), f.err)
		}
		id := runOf(f)
		if f.Kind != protocol.FrameEnvelope || !slices.Contains(want, id) {
			t.Fatalf("frame %s: want an envelope of runs %v", f.raw, want)
		}
		runs[id] = append(runs[id], f)
		if f.Type.Terminal() {
			ended++
		}
	}
	return runs
}

// sameRun asserts that a followed run's frames are the run's log, from its first event to
// its terminal: the same offsets and events, in order.
func sameRun(t testing.TB, what string, got, log []frame) {
	t.Helper()
	var g, l []string
	for _, f := range got {
		g = append(g, f.Offset+" "+string(f.Event))
	}
	for _, f := range log {
		l = append(l, f.Offset+" "+string(f.Event))
	}
	if !slices.Equal(g, l) {
		t.Errorf("%s: %d frames\n%s\nwant the log's %d\n%s", what, len(g), strings.Join(g, "\n"), len(l), strings.Join(l, "\n"))
	}
}

// TestFollowAcrossGateways: sockets on two gateways sharing NATS follow one thread. A
// follower receives each run of the thread, started on either gateway, from any socket or
// from HTTP, from its first event to its terminal, once and in order, with its runId; a run
// running when the follow arrives is delivered from its start; the socket that started a
// run does not receive it twice; three runs at once (multitaskStrategy concurrent) all arrive
// complete.
func TestFollowAcrossGateways(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL()})

	b := dial(t, e2.url(), "")
	b.send(followFrame("follow", "T"))
	a := dial(t, e1.url(), "")
	a.send(followFrame("follow", "T"))
	// The follows are handled in order with the run frames of their sockets: a run frame
	// sent on a socket after its follow is delivered to it whether it is announced or found
	// running.
	a.send(threadRunFrame("T", "r1", script{Tokens: 20, IntervalMs: 5}))
	own := a.untilTerminal()
	if got := summary(own); got != tokenTurn(20) {
		t.Fatalf("the starting socket got %s", got)
	}
	for _, f := range own {
		if runOf(f) != "" {
			t.Fatalf("the starting socket got its own run as a followed run: %s", f.raw)
		}
	}
	got := followed(t, b, "r1")
	log, end := e1.resume(t, "r1", "-1")
	if end.code != 1000 {
		t.Fatalf("resume of r1 closed %d", end.code)
	}
	sameRun(t, "follower on the other gateway, r1", got["r1"], log)
	sameRun(t, "the starting socket, r1", own, log)

	// A second socket (other gateway) starts r2: the first socket, which follows T, gets it
	// and nothing more of r1.
	c := dial(t, e2.url(), "")
	c.send(threadRunFrame("T", "r2", script{Tokens: 3}))
	c.untilTerminal()
	log2, _ := e2.resume(t, "r2", "-1")
	sameRun(t, "the first socket, r2", followed(t, a, "r2")["r2"], log2)
	sameRun(t, "follower, r2", followed(t, b, "r2")["r2"], log2)

	// Halfway: r3 runs; a new follower gets it from its start.
	a.send(threadRunFrame("T", "r3", script{Tokens: 40, IntervalMs: 20}))
	for n := 0; n < 10; {
		if f := a.next(20 * time.Second); f.err != nil {
			t.Fatal(f.err)
		} else if f.Type == "TEXT_MESSAGE_CONTENT" {
			n++
		}
	}
	late := dial(t, e2.url(), "")
	late.send(followFrame("follow", "T"))
	got = followed(t, late, "r3")
	log3, _ := e1.resume(t, "r3", "-1")
	if summary(log3) != tokenTurn(40) {
		t.Fatalf("log of r3: %s", summary(log3))
	}
	sameRun(t, "follower that came halfway, r3", got["r3"], log3)
	sameRun(t, "follower, r3", followed(t, b, "r3")["r3"], log3)

	// Three runs at once: two sockets on two gateways and a POST on the thread's runs.
	s1, s2 := dial(t, e1.url(), ""), dial(t, e2.url(), "")
	s1.send(withStrategy(threadRunFrame("T", "r4", script{Tokens: 30, IntervalMs: 10}), conversation.MultitaskConcurrent))
	s2.send(withStrategy(threadRunFrame("T", "r5", script{Tokens: 30, IntervalMs: 10}), conversation.MultitaskConcurrent))
	resp, err := http.Post(e1.http.URL+"/api/threads/T/runs", "application/json",
		strings.NewReader(`{"runId":"r6","messages":[{"id":"u","role":"user","content":"x"}],"forwardedProps":{"test":{"tokens":30,"intervalMs":10}},"multitaskStrategy":"concurrent"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || string(body) != `{"runId":"r6","joinUrl":"/api/chat?offset=-1\u0026runId=r6"}`+"\n" {
		t.Fatalf("POST /api/threads/T/runs = %d %s", resp.StatusCode, body)
	}
	all := followed(t, b, "r4", "r5", "r6")
	for _, id := range []string{"r4", "r5", "r6"} {
		log, _ := e2.resume(t, id, "-1")
		if summary(log) != tokenTurn(30) {
			t.Fatalf("log of %s: %s", id, summary(log))
		}
		sameRun(t, "follower, "+id, all[id], log)
	}
}

// TestFollowBoundaries: unfollow stops delivery; another principal following the same
// threadId string receives nothing; a follow beyond the socket's limit is refused with a
// bare RUN_ERROR limit_exceeded and the socket goes on.
func TestFollowBoundaries(t *testing.T) {
	e := newEnv(t, envOptions{maxFollows: 2})
	f := dial(t, e.url(), "")
	f.send(followFrame("follow", "T"))
	f.send(followFrame("follow", "U"))
	f.send(followFrame("follow", "V"))
	if fr := f.next(10 * time.Second); fr.Kind != protocol.FrameEvent || fr.Type != "RUN_ERROR" ||
		!strings.Contains(fr.raw, conversation.MsgTooManyFollows) || !strings.Contains(fr.raw, `"code":"limit_exceeded"`) {
		t.Fatalf("third follow answered %s (%v), want a bare RUN_ERROR limit_exceeded", fr.raw, fr.err)
	}
	f.send(followFrame("follow", "T")) // again: no change, no refusal
	f.send(followFrame("unfollow", "T"))
	handled(t, f)
	other := dial(t, e.url(), "p2")
	other.send(followFrame("follow", "U"))
	handled(t, other)

	starter := dial(t, e.url(), "")
	starter.send(threadRunFrame("T", "after-unfollow", script{Tokens: 2}))
	starter.untilTerminal()
	// A run of U, started after the run of T ended: the follower gets it alone.
	starter.send(threadRunFrame("U", "marker", script{Tokens: 2}))
	starter.untilTerminal()
	got := followed(t, f, "marker")
	if summary(got["marker"]) != tokenTurn(2) {
		t.Fatalf("marker: %s", summary(got["marker"]))
	}
	// The other principal's U is another thread: a run of its own arrives alone.
	p2 := dial(t, e.url(), "p2")
	p2.send(threadRunFrame("U", "p2-run", script{Tokens: 1}))
	p2.untilTerminal()
	if got := followed(t, other, "p2-run"); summary(got["p2-run"]) != tokenTurn(1) {
		t.Fatalf("p2's own run: %s", summary(got["p2-run"]))
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "max_follows"); n != 1 {
		t.Errorf("limit refusals {max_follows} = %v, want 1", n)
	}
}

// TestAbortOnResumeSocket: after a drop, the client's only socket is a resume socket of
// the turn, on another gateway: an abort frame there ends the turn RUN_ERROR aborted.
func TestAbortOnResumeSocket(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL()})
	a := dial(t, e1.url(), "")
	a.send(threadRunFrame("T", "long", script{Tokens: 1000, IntervalMs: 20}))
	var last string
	for n := 0; n < 3; {
		f := a.next(20 * time.Second)
		if f.err != nil {
			t.Fatal(f.err)
		}
		last = f.Offset
		if f.Type == "TEXT_MESSAGE_CONTENT" {
			n++
		}
	}
	a.c.CloseNow()
	r := dial(t, e2.url("runId", "long", "offset", last), "")
	r.send(abortFrame("long"))
	frames, end := r.untilClose()
	if end.code != 1000 || len(frames) == 0 || summary(frames[len(frames)-1:]) != "RUN_ERROR:aborted" {
		t.Fatalf("resume socket after its abort: %s, closed %d", summary(frames), end.code)
	}
}

// TestAbortElsewhereReachesOwner: a turn aborted from a socket of another gateway, or over
// HTTP, delivers nothing more live, so the socket that started it is sent the rest of its log
// (envelopes naming the run): it sees every event once and the RUN_ERROR aborted. A turn its
// own socket aborts sends nothing more.
func TestAbortElsewhereReachesOwner(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL()})
	for _, how := range []string{"socket", "http", "own"} {
		t.Run(how, func(t *testing.T) {
			runID := "aborted-by-" + how
			a := dial(t, e1.url(), "")
			a.send(threadRunFrame("T", runID, script{Tokens: 1000, IntervalMs: 10}))
			var got []frame
			for n := 0; n < 3; {
				f := a.next(20 * time.Second)
				got = append(got, f)
				if f.Type == "TEXT_MESSAGE_CONTENT" {
					n++
				}
			}
			switch how {
			case "socket":
				dial(t, e2.url(), "").send(abortFrame(runID))
			case "http":
				resp, err := http.Post(e2.http.URL+"/api/runs/"+runID+"/abort", "", nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			case "own":
				a.send(abortFrame(runID))
			}
			e1.waitClosed(t, runID)
			log, _ := e1.resume(t, runID, "-1")
			if how == "own" {
				// The frames delivered before the abort took effect, then nothing.
				for {
					f := a.next(time.Second)
					if f.err != nil {
						break
					}
					if runOf(f) != "" {
						t.Fatalf("own abort: the socket got %s", f.raw)
					}
					got = append(got, f)
				}
				sameRun(t, "own abort, what the socket got", got, log[:len(got)])
				return
			}
			for !got[len(got)-1].Type.Terminal() {
				f := a.next(20 * time.Second)
				if f.err != nil {
					t.Fatalf("the owner's socket ended before the terminal: %v", f.err)
				}
				if id := runOf(f); id != "" && id != runID {
					t.Fatalf("frame of another run: %s", f.raw)
				}
				got = append(got, f)
			}
			sameRun(t, "the owner's socket", got, log)
			if summary(got[len(got)-1:]) != "RUN_ERROR:aborted" {
				t.Fatalf("the owner's socket ends with %s", summary(got[len(got)-1:]))
			}
		})
	}
}

// TestSlowFollower: a follower that does not read while a followed run produces more than
// the connection's buffers hold loses nothing of it: the replay waits for it, and a socket
// the gateway closed meanwhile (1013 "slow consumer", or without a close frame when a write
// timed out) resumes the run by the last offset it received; it has the whole run once.
func TestSlowFollower(t *testing.T) {
	e := newEnv(t, envOptions{queueSize: 4, writeTimeout: time.Second})
	f := dialSmallBuffer(t, e.url())
	f.send(followFrame("follow", "T"))
	handled(t, f)
	starter := dial(t, e.url(), "")
	starter.send(threadRunFrame("T", "slow-follow", script{Tokens: 300, DeltaBytes: 32 << 10}))
	e.waitClosed(t, "slow-follow")
	var got []frame
	for {
		fr := f.next(20 * time.Second)
		if fr.err != nil {
			if fr.code != conversation.StatusSlowConsumer && fr.code != -1 {
				t.Fatalf("follower closed %v after %d frames, want 1013 slow consumer or the connection closed", fr.err, len(got))
			}
			if len(got) == 0 {
				t.Fatal("follower closed before any frame")
			}
			rest, _ := e.resume(t, "slow-follow", got[len(got)-1].Offset)
			got = append(got, rest...)
			break
		}
		if runOf(fr) != "slow-follow" {
			t.Fatalf("frame %s, want an envelope of slow-follow", fr.raw)
		}
		got = append(got, fr)
		if fr.Type.Terminal() {
			break
		}
	}
	distinctOffsets(t, got)
	if s := summary(got); s != tokenTurn(300) {
		t.Errorf("followed (and resumed) = %d events, want the whole run (305)", len(got))
	}
}

// TestThreadRuns: POST /api/threads/{threadId}/runs starts a turn without a socket (runId
// minted when absent) that a follower of the thread receives whole, that its join URL
// replays and that the thread's hydrate shows; bad requests are refused before anything starts.
func TestThreadRuns(t *testing.T) {
	e := newEnv(t, envOptions{})
	f := dial(t, e.url(), "")
	f.send(followFrame("follow", "T"))
	handled(t, f)
	post := func(path, body string) (int, map[string]string) {
		t.Helper()
		resp, err := http.Post(e.http.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]string
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	status, out := post("/api/threads/T/runs", `{"messages":[{"id":"u","role":"user","content":"x"}],"forwardedProps":{"test":{"tokens":3}}}`)
	runID := out["runId"]
	if status != http.StatusAccepted || !strings.HasPrefix(runID, "run-") || len(runID) != 30 ||
		out["joinUrl"] != "/api/chat?offset=-1&runId="+runID {
		t.Fatalf("POST = %d %v, want 202 with a minted runId and its join URL", status, out)
	}
	got := followed(t, f, runID)
	log, _ := e.resume(t, runID, "-1")
	sameRun(t, "follower of a server-started run", got[runID], log)
	if summary(log) != tokenTurn(3) {
		t.Fatalf("log: %s", summary(log))
	}
	resp, err := http.Get(e.http.URL + out["joinUrl"])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"type":"RUN_FINISHED"`) {
		t.Fatalf("GET join URL = %d %s", resp.StatusCode, body)
	}
	// Its thread shows it like any other turn.
	if h := e.hydrate(t, "/api/chat", "", "threadId", "T"); h.ActiveRun != nil || h.summary() != "u user: x | m-"+runID+"-1 assistant: t1 t2 t3  | " {
		t.Errorf("hydrate of the thread after a server-started turn = %s", h.raw)
	}
	for _, tt := range []struct{ body, want string }{
		{`[]`, "the request body is not a JSON object: a RunAgentInput is expected"},
		{`{"threadId":"U","messages":[]}`, "the body's threadId differs from the path's"},
		{`{"messages":"no"}`, "messages: required array"},
	} {
		if status, out := post("/api/threads/T/runs", tt.body); status != http.StatusBadRequest || out["error"] != tt.want {
			t.Errorf("POST %s = %d %v, want 400 %q", tt.body, status, out, tt.want)
		}
	}
	// Another principal's runId is refused.
	req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/api/threads/T/runs", strings.NewReader(`{"runId":"`+runID+`","messages":[]}`))
	req.Header.Set("X-Principal", "p2")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("another principal's runId: %d, want 403", resp.StatusCode)
	}
}

// TestFollowReplayKeepsOwnTurns: a socket that reads, and follows a thread whose run
// produces faster than the socket writes, receives the whole followed run and its own turn
// meanwhile: the follow's replay waits for room in the socket's queue instead of closing the
// socket 1013, which would end the live delivery of the socket's own turns.
func TestFollowReplayKeepsOwnTurns(t *testing.T) {
	// The replay may fill half the queue: the other half, 4 frames, holds the own turn's
	// frames (one every 50 ms) while the writer is busy with the replay's 16 KB frames, 200 ms
	// on a busy machine (with 2 of 4 it closed the socket now and then in CI, on the tree
	// before the thread log too).
	e := newEnv(t, envOptions{queueSize: 8})
	cl := dial(t, e.url(), "")
	cl.send(followFrame("follow", "T"))
	handled(t, cl)
	cl.send(runFrame("own", script{Tokens: 20, IntervalMs: 50}))
	starter := dial(t, e.url(), "")
	starter.send(threadRunFrame("T", "big", script{Tokens: 300, DeltaBytes: 16 << 10}))
	var own, big []frame
	for ended := 0; ended < 2; {
		f := cl.next(30 * time.Second)
		if f.err != nil {
			t.Fatalf("socket ended after %d frames of its own turn and %d of the followed run: %v", len(own), len(big), f.err)
		}
		switch runOf(f) {
		case "big":
			big = append(big, f)
		case "":
			own = append(own, f)
		default:
			t.Fatalf("frame %s: want its own turn's or the followed run's", f.raw)
		}
		if f.Type.Terminal() {
			ended++
		}
	}
	if s := summary(own); s != tokenTurn(20) {
		t.Errorf("own turn: %s, want %s", s, tokenTurn(20))
	}
	if s := summary(big); s != tokenTurn(300) {
		t.Errorf("followed run: %d frames, want the whole run", len(big))
	}
}

// dialSmallBuffer opens a socket whose connection receives into a 64 KiB kernel buffer (no
// autotuning), so that a client that does not read stalls the gateway's writes soon.
func dialSmallBuffer(t testing.TB, u string) *client {
	t.Helper()
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			err = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return dialWith(t, u, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
}
