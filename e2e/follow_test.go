package e2e

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// Threads live across gateway processes (THREADS.md sections 2 and 3): sockets of one
// principal on two gateways sharing one NATS follow a thread, and stop its runs from
// wherever they are.

// threadGateways are two gateway processes on one NATS with JWT authentication, so that
// tests have several principals, and the key that signs their tokens.
type threadGateways struct {
	g1, g2 *gateway
	key    *ecdsa.PrivateKey
	args   []string
}

func startThreadGateways(tb testing.TB) *threadGateways {
	tb.Helper()
	key, pemFile := newJWTKey(tb)
	args := []string{"--auth", "jwt", "--jwt-key-file", pemFile, "--jwt-audience", secAudience, "--jwt-issuer", secIssuer,
		"--lease-ttl", "2s", "--takeover", "off"}
	g1 := startGateway(tb, args...)
	g2 := startGateway(tb, append(slices.Clone(args), "--nats-url", g1.NATSURL)...)
	return &threadGateways{g1: g1, g2: g2, key: key, args: args}
}

// token returns a valid token of sub.
func (tg *threadGateways) token(tb testing.TB, sub string) string {
	return signToken(tb, jwt.SigningMethodES256, tg.key, claimsFor(sub))
}

// dial opens a conversation socket (query "") or a resume socket on gw as sub.
func (tg *threadGateways) dial(tb testing.TB, ctx context.Context, gw *gateway, sub, query string) *websocket.Conn {
	tb.Helper()
	u := gw.WS
	if query != "" {
		u += "?" + query
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: bearer(tg.token(tb, sub))})
	if err != nil {
		tb.Fatalf("dial %s as %s: %v", u, sub, err)
	}
	c.SetReadLimit(1 << 20)
	tb.Cleanup(func() { c.CloseNow() })
	return c
}

// post sends a POST with sub's token and returns the status and body.
func (tg *threadGateways) post(tb testing.TB, ctx context.Context, url, sub, body string) (int, string) {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tg.token(tb, sub))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// threadFrame is a demo run frame of thread for runID, posting a new user message of its own
// (a new turn, not a regenerate).
func threadFrame(thread, runID, demoOpts string) []byte {
	return []byte(`{"threadId":"` + thread + `","runId":"` + runID + `","messages":[{"id":"u-` + runID + `","role":"user","content":"hi"}],"forwardedProps":{"demo":` + demoOpts + `}}`)
}

func sendText(tb testing.TB, ctx context.Context, c *websocket.Conn, data string) {
	tb.Helper()
	if err := c.Write(ctx, websocket.MessageText, []byte(data)); err != nil {
		tb.Fatalf("write %s: %v", data, err)
	}
}

// twire is a frame read from a socket: an envelope (with the runId of a followed run), a
// bare event, or the close.
type twire struct {
	RunID, Offset, Type, Name, Code, Delta string
	Bare                                   bool
	Chunk                                  string
	Close                                  websocket.StatusCode // -1 unless closed
}

func (w twire) terminal() bool { return w.Type == "RUN_FINISHED" || w.Type == "RUN_ERROR" }

// readT reads the next frame that is not a ping.
func readT(tb testing.TB, ctx context.Context, c *websocket.Conn) twire {
	tb.Helper()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st != -1 {
				return twire{Close: st}
			}
			tb.Fatalf("read: %v", err)
		}
		var f struct {
			ID    string          `json:"id"`
			RunID string          `json:"runId"`
			Chunk json.RawMessage `json:"chunk"`
			Type  string          `json:"type"`
		}
		if err := json.Unmarshal(data, &f); err != nil {
			tb.Fatalf("frame %s: %v", data, err)
		}
		if f.Type == "ping" {
			continue
		}
		w := twire{RunID: f.RunID, Offset: f.ID, Bare: f.Chunk == nil, Close: -1}
		ev := data
		if !w.Bare {
			ev = f.Chunk
		}
		var e struct{ Type, Name, Code, Delta string }
		json.Unmarshal(ev, &e)
		w.Type, w.Name, w.Code, w.Delta, w.Chunk = e.Type, e.Name, e.Code, e.Delta, string(ev)
		return w
	}
}

// readOwnTurn reads a socket's own turn (envelopes without runId) to its terminal.
func readOwnTurn(tb testing.TB, ctx context.Context, c *websocket.Conn) []twire {
	tb.Helper()
	var out []twire
	for {
		w := readT(tb, ctx, c)
		if w.Close != -1 || w.Bare || w.RunID != "" {
			tb.Fatalf("reading the socket's own turn: got %+v", w)
		}
		out = append(out, w)
		if w.terminal() {
			return out
		}
	}
}

// followRuns reads envelopes of followed runs until each run of want delivered its
// terminal; any other frame fails the test.
func followRuns(tb testing.TB, ctx context.Context, c *websocket.Conn, want ...string) map[string][]twire {
	tb.Helper()
	runs := map[string][]twire{}
	for ended := 0; ended < len(want); {
		w := readT(tb, ctx, c)
		if w.Close != -1 || w.Bare || !slices.Contains(want, w.RunID) {
			tb.Fatalf("following runs %v: got %+v", want, w)
		}
		runs[w.RunID] = append(runs[w.RunID], w)
		if w.terminal() {
			ended++
		}
	}
	return runs
}

// handledT waits until c's gateway handled the frames sent before on c: a follow frame
// without a threadId is answered, in order.
func handledT(tb testing.TB, ctx context.Context, c *websocket.Conn) {
	tb.Helper()
	sendText(tb, ctx, c, `{"type":"follow"}`)
	if w := readT(tb, ctx, c); !w.Bare || w.Code != "invalid_input" {
		tb.Fatalf("answer to an invalid follow frame: %+v", w)
	}
}

// runLog reads runID's whole log on gw as sub (a resume socket from -1 until its close).
func (tg *threadGateways) runLog(tb testing.TB, ctx context.Context, gw *gateway, sub, runID string) []twire {
	tb.Helper()
	c := tg.dial(tb, ctx, gw, sub, "runId="+runID+"&offset=-1")
	var out []twire
	for {
		w := readT(tb, ctx, c)
		if w.Close != -1 {
			if w.Close != websocket.StatusNormalClosure {
				tb.Fatalf("log of %s: closed %d", runID, w.Close)
			}
			return out
		}
		out = append(out, w)
	}
}

// sameAsRunLog asserts that frames are the log's events with its offsets, in order, from the
// first (run.accepted) to the terminal.
func sameAsRunLog(tb testing.TB, what string, got, log []twire) {
	tb.Helper()
	var g, l []string
	for _, w := range got {
		g = append(g, w.Offset+" "+w.Chunk)
	}
	for _, w := range log {
		l = append(l, w.Offset+" "+w.Chunk)
	}
	if !slices.Equal(g, l) {
		tb.Errorf("%s: %d frames, want the log's %d\ngot:\n%s\nlog:\n%s", what, len(g), len(l), strings.Join(g, "\n"), strings.Join(l, "\n"))
	}
	if len(l) == 0 || l[0] != log[0].Offset+` {"type":"CUSTOM","name":"run.accepted","value":{}}` || !log[len(log)-1].terminal() {
		tb.Errorf("%s: the log does not go from run.accepted to a terminal", what)
	}
}

// waitContent reads c's own turn until n content events arrived, and returns the last
// offset read.
func waitContent(tb testing.TB, ctx context.Context, c *websocket.Conn, n int) string {
	tb.Helper()
	last := ""
	for got := 0; got < n; {
		w := readT(tb, ctx, c)
		if w.Close != -1 || w.Bare || w.terminal() {
			tb.Fatalf("turn ended before %d deltas: %+v", n, w)
		}
		last = w.Offset
		if w.Type == "TEXT_MESSAGE_CONTENT" {
			got++
		}
	}
	return last
}

// TestThreadFollowTwoGateways: tab A on gateway 1 sends turns; tab B on gateway 2 follows the
// thread and gets every event of each once, in order, with its runId, equal to the log; a
// follower that comes halfway through a turn gets it from its start; three turns of the
// thread at once (multitaskStrategy concurrent: two sockets on two gateways and a
// server-started turn) each reach the follower complete; unfollow stops delivery; another principal following the same threadId
// string gets nothing.
func TestThreadFollowTwoGateways(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tg := startThreadGateways(t)

	b := tg.dial(t, ctx, tg.g2, "alice", "")
	sendText(t, ctx, b, `{"type":"follow","threadId":"T"}`)
	mallory := tg.dial(t, ctx, tg.g2, "mallory", "")
	sendText(t, ctx, mallory, `{"type":"follow","threadId":"T"}`)
	handledT(t, ctx, b)
	handledT(t, ctx, mallory)
	a := tg.dial(t, ctx, tg.g1, "alice", "")
	sendText(t, ctx, a, `{"type":"follow","threadId":"T"}`)

	t.Run("a turn of tab A reaches tab B", func(t *testing.T) {
		sendText(t, ctx, a, string(threadFrame("T", "turn-1", `{"tokens":30,"intervalMs":10}`)))
		own := readOwnTurn(t, ctx, a)
		got := followRuns(t, ctx, b, "turn-1")
		log := tg.runLog(t, ctx, tg.g2, "alice", "turn-1")
		sameAsRunLog(t, "tab A, its own turn", own, log)
		sameAsRunLog(t, "tab B, following", got["turn-1"], log)
		if last := log[len(log)-1]; last.Type != "RUN_FINISHED" {
			t.Fatalf("turn-1 ended %+v", last)
		}
	})

	t.Run("a follower that comes halfway gets the turn from its start", func(t *testing.T) {
		sendText(t, ctx, a, string(threadFrame("T", "turn-2", `{"tokens":60,"intervalMs":20}`)))
		waitContent(t, ctx, a, 15)
		late := tg.dial(t, ctx, tg.g2, "alice", "")
		sent := time.Now()
		sendText(t, ctx, late, `{"type":"follow","threadId":"T"}`)
		first := readT(t, ctx, late)
		t.Logf("follow frame on gateway 2 → first frame of the turn running on gateway 1: %v", time.Since(sent))
		got := followRuns(t, ctx, late, "turn-2")
		got["turn-2"] = append([]twire{first}, got["turn-2"]...)
		log := tg.runLog(t, ctx, tg.g1, "alice", "turn-2")
		sameAsRunLog(t, "late follower", got["turn-2"], log)
		sameAsRunLog(t, "tab B", followRuns(t, ctx, b, "turn-2")["turn-2"], log)
		readOwnTurn(t, ctx, a)
	})

	t.Run("three turns at once", func(t *testing.T) {
		s2 := tg.dial(t, ctx, tg.g2, "alice", "")
		sendText(t, ctx, a, string(concurrent(threadFrame("T", "turn-3a", `{"tokens":40,"intervalMs":10}`))))
		sendText(t, ctx, s2, string(concurrent(threadFrame("T", "turn-3b", `{"tokens":40,"intervalMs":10}`))))
		status, body := tg.post(t, ctx, tg.g2.URL+"/api/threads/T/runs", "alice",
			`{"runId":"turn-3c","messages":[{"id":"u-turn-3c","role":"user","content":"scheduled"}],"forwardedProps":{"demo":{"tokens":40,"intervalMs":10}},"multitaskStrategy":"concurrent"}`)
		if status != http.StatusAccepted || body != `{"runId":"turn-3c","joinUrl":"/api/chat?offset=-1\u0026runId=turn-3c"}` {
			t.Fatalf("POST /api/threads/T/runs = %d %s", status, body)
		}
		got := followRuns(t, ctx, b, "turn-3a", "turn-3b", "turn-3c")
		// Tab A gets its own turn live, and the two others as followed runs.
		gotA := followRunsWithOwn(t, ctx, a, "turn-3a", "turn-3b", "turn-3c")
		for _, id := range []string{"turn-3a", "turn-3b", "turn-3c"} {
			log := tg.runLog(t, ctx, tg.g1, "alice", id)
			if n, last := len(log), log[len(log)-1]; n != 45 || last.Type != "RUN_FINISHED" {
				t.Errorf("log of %s has %d events ending %s, want 45 ending RUN_FINISHED", id, n, last.Type)
			}
			sameAsRunLog(t, "tab B, "+id, got[id], log)
			sameAsRunLog(t, "tab A, "+id, gotA[id], log)
		}
		readOwnTurn(t, ctx, s2)
	})

	t.Run("unfollow stops delivery", func(t *testing.T) {
		sendText(t, ctx, b, `{"type":"unfollow","threadId":"T"}`)
		sendText(t, ctx, b, `{"type":"follow","threadId":"U"}`)
		handledT(t, ctx, b)
		sendText(t, ctx, a, string(threadFrame("T", "turn-4", `{"tokens":5,"intervalMs":0}`)))
		readOwnTurn(t, ctx, a)
		// A turn of U started after turn-4 ended: tab B gets it, and nothing of turn-4.
		sendText(t, ctx, a, string(threadFrame("U", "marker-u", `{"tokens":2,"intervalMs":0}`)))
		readOwnTurn(t, ctx, a)
		followRuns(t, ctx, b, "marker-u")
	})

	t.Run("another principal's same threadId gets nothing", func(t *testing.T) {
		// Mallory followed "T" before every turn above; her own turn of "T" is the first
		// thing she receives.
		m2 := tg.dial(t, ctx, tg.g1, "mallory", "")
		sendText(t, ctx, m2, string(threadFrame("T", "mallory-1", `{"tokens":2,"intervalMs":0}`)))
		readOwnTurn(t, ctx, m2)
		followRuns(t, ctx, mallory, "mallory-1")
	})
}

// followRunsWithOwn reads a socket that follows a thread and started one of its runs
// itself: own is delivered without runId, the others with theirs. It returns every run's
// frames.
func followRunsWithOwn(tb testing.TB, ctx context.Context, c *websocket.Conn, own string, others ...string) map[string][]twire {
	tb.Helper()
	runs := map[string][]twire{}
	for ended := 0; ended < len(others)+1; {
		w := readT(tb, ctx, c)
		id := w.RunID
		if id == "" {
			id = own
		}
		if w.Close != -1 || w.Bare || (id != own && !slices.Contains(others, id)) {
			tb.Fatalf("following %v: got %+v", others, w)
		}
		runs[id] = append(runs[id], w)
		if w.terminal() {
			ended++
		}
	}
	return runs
}

// TestThreadAbortAnywhere stops turns of alice's thread from every place a client may be:
// a second socket on the other gateway, HTTP, the resume socket after a drop, and a new
// socket right after a reload. Each turn ends RUN_ERROR aborted (the time from the abort to
// the terminal is logged), its log verifies, and a second abort answers aborted again.
// Mallory's aborts of alice's turn are refused and it completes; an abort of a turn whose
// gateway died is answered with the reaper's outcome.
func TestThreadAbortAnywhere(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tg := startThreadGateways(t)
	const long = `{"tokens":2000,"intervalMs":20}`

	// start starts a long turn of thread T on tab A (gateway 1) and waits for its first
	// deltas; it returns tab A's socket and the last offset it received.
	start := func(t *testing.T, runID string) (*websocket.Conn, string) {
		a := tg.dial(t, ctx, tg.g1, "alice", "")
		sendText(t, ctx, a, string(threadFrame("T", runID, long)))
		return a, waitContent(t, ctx, a, 3)
	}
	// ended checks the turn's log: it ends RUN_ERROR aborted and verifies; then a second
	// abort over HTTP answers aborted again.
	ended := func(t *testing.T, runID string) {
		log := tg.runLog(t, ctx, tg.g2, "alice", runID)
		if last := log[len(log)-1]; last.Type != "RUN_ERROR" || last.Code != "aborted" {
			t.Fatalf("log of %s ends %+v, want RUN_ERROR aborted", runID, last)
		}
		var chunks []string
		for _, w := range log[1:] { // but the run.accepted marker
			chunks = append(chunks, w.Chunk)
		}
		verifyLog(t, chunks)
		status, body := tg.post(t, ctx, tg.g1.URL+"/api/runs/"+runID+"/abort", "alice", "")
		if status != http.StatusOK || body != `{"runId":"`+runID+`","outcome":"aborted"}` {
			t.Fatalf("second abort of %s = %d %s", runID, status, body)
		}
	}
	// untilTerminal reads c (following T) until runID's terminal and returns it.
	untilTerminal := func(t *testing.T, c *websocket.Conn, runID string) twire {
		for {
			w := readT(t, ctx, c)
			if w.Close != -1 || w.Bare {
				t.Fatalf("waiting for the end of %s: %+v", runID, w)
			}
			if (w.RunID == runID || w.RunID == "") && w.terminal() {
				return w
			}
		}
	}

	t.Run("second socket on the other gateway", func(t *testing.T) {
		a, _ := start(t, "abort-socket")
		b := tg.dial(t, ctx, tg.g2, "alice", "")
		sendText(t, ctx, b, `{"type":"follow","threadId":"T"}`)
		for w := readT(t, ctx, b); w.Type != "TEXT_MESSAGE_CONTENT"; w = readT(t, ctx, b) {
		}
		sent := time.Now()
		sendText(t, ctx, b, `{"type":"abort","runId":"abort-socket"}`)
		w := untilTerminal(t, b, "abort-socket")
		t.Logf("abort frame on a socket of the other gateway → terminal on that socket: %v", time.Since(sent))
		if w.Type != "RUN_ERROR" || w.Code != "aborted" || time.Since(sent) > 10*time.Second {
			t.Fatalf("terminal %+v after %v", w, time.Since(sent))
		}
		// Tab A, which started the turn, sees it end too.
		if w := untilTerminal(t, a, "abort-socket"); w.Type != "RUN_ERROR" || w.Code != "aborted" {
			t.Fatalf("tab A's terminal %+v", w)
		}
		t.Logf("abort frame on a socket of the other gateway → terminal on the starting socket: %v", time.Since(sent))
		ended(t, "abort-socket")
	})

	t.Run("HTTP", func(t *testing.T) {
		start(t, "abort-http")
		sent := time.Now()
		status, body := tg.post(t, ctx, tg.g2.URL+"/api/runs/abort-http/abort", "alice", "")
		t.Logf("POST /api/runs/{runId}/abort on the other gateway → answer: %v", time.Since(sent))
		if status != http.StatusOK || body != `{"runId":"abort-http","outcome":"aborted"}` || time.Since(sent) > 10*time.Second {
			t.Fatalf("abort = %d %s after %v", status, body, time.Since(sent))
		}
		ended(t, "abort-http")
	})

	t.Run("resume socket after a drop", func(t *testing.T) {
		a, last := start(t, "abort-resume")
		a.CloseNow() // the drop
		r := tg.dial(t, ctx, tg.g2, "alice", "runId=abort-resume&offset="+last)
		readT(t, ctx, r) // the resume is under way
		sent := time.Now()
		sendText(t, ctx, r, `{"type":"abort","runId":"abort-resume"}`)
		w := untilTerminal(t, r, "abort-resume")
		t.Logf("abort frame on the resume socket after a drop → terminal on it: %v", time.Since(sent))
		if w.Type != "RUN_ERROR" || w.Code != "aborted" || time.Since(sent) > 10*time.Second {
			t.Fatalf("terminal %+v after %v", w, time.Since(sent))
		}
		if end := readT(t, ctx, r); end.Close != websocket.StatusNormalClosure {
			t.Fatalf("resume socket after the terminal: %+v, want close 1000", end)
		}
		ended(t, "abort-resume")
	})

	t.Run("new socket right after a reload", func(t *testing.T) {
		a, _ := start(t, "abort-reload")
		a.CloseNow() // the reload
		// The reloaded page follows its thread, shows the turn, and its Stop sends the abort.
		n := tg.dial(t, ctx, tg.g2, "alice", "")
		sendText(t, ctx, n, `{"type":"follow","threadId":"T"}`)
		if w := readT(t, ctx, n); w.RunID != "abort-reload" || w.Name != "run.accepted" {
			t.Fatalf("first frame after the follow: %+v, want the turn from its start", w)
		}
		sent := time.Now()
		sendText(t, ctx, n, `{"type":"abort","runId":"abort-reload"}`)
		w := untilTerminal(t, n, "abort-reload")
		t.Logf("abort frame on a new socket right after a reload → terminal on it (followed): %v", time.Since(sent))
		if w.Type != "RUN_ERROR" || w.Code != "aborted" || time.Since(sent) > 10*time.Second {
			t.Fatalf("terminal %+v after %v", w, time.Since(sent))
		}
		ended(t, "abort-reload")
	})

	t.Run("another principal's abort is refused", func(t *testing.T) {
		a := tg.dial(t, ctx, tg.g1, "alice", "")
		sendText(t, ctx, a, string(threadFrame("T", "alice-only", `{"tokens":40,"intervalMs":20}`)))
		waitContent(t, ctx, a, 3)
		m := tg.dial(t, ctx, tg.g2, "mallory", "")
		sendText(t, ctx, m, `{"type":"abort","runId":"alice-only"}`)
		status, body := tg.post(t, ctx, tg.g2.URL+"/api/runs/alice-only/abort", "mallory", "")
		if status != http.StatusNotFound || body != `{"error":"unknown or expired run"}` {
			t.Fatalf("mallory's HTTP abort = %d %s, want 404", status, body)
		}
		if w := readOwnTurn(t, ctx, a); w[len(w)-1].Type != "RUN_FINISHED" {
			t.Fatalf("alice's turn ended %+v, want RUN_FINISHED", w[len(w)-1])
		}
	})

	t.Run("the producer died: the reaper's outcome", func(t *testing.T) {
		g3 := startGateway(t, append(slices.Clone(tg.args), "--nats-url", tg.g1.NATSURL)...)
		c := tg.dial(t, ctx, g3, "alice", "")
		sendText(t, ctx, c, string(threadFrame("T", "orphan", long)))
		waitContent(t, ctx, c, 3)
		g3.signal(t, syscall.SIGKILL)
		g3.wait(t, 10*time.Second)
		sent := time.Now()
		status, body := tg.post(t, ctx, tg.g2.URL+"/api/runs/orphan/abort", "alice", "")
		t.Logf("abort of a run whose gateway died → the reaper's outcome: %v", time.Since(sent))
		if status != http.StatusOK || body != `{"runId":"orphan","outcome":"error"}` {
			t.Fatalf("abort of the orphan = %d %s", status, body)
		}
		log := tg.runLog(t, ctx, tg.g1, "alice", "orphan")
		if last := log[len(log)-1]; last.Type != "RUN_ERROR" || last.Code != "producer_lost" {
			t.Fatalf("orphan's log ends %+v, want RUN_ERROR producer_lost", last)
		}
	})
}
