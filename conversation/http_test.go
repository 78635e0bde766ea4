package conversation_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/protocol"
)

// framings are the two HTTP transports and their paths.
var framings = []struct {
	name, path, contentType string
	framing                 conversation.Framing
}{
	{"sse", "/api/chat", "text/event-stream", conversation.SSE},
	{"ndjson", "/api/chat/ndjson", "application/x-ndjson", conversation.NDJSON},
}

// stream is a test HTTP streaming response.
type stream struct {
	t     testing.TB
	resp  *http.Response
	br    *bufio.Reader
	ndj   bool
	pings int
}

// httpDo sends a request to path (with query kv pairs for a GET) and returns the response.
func (e *env) httpDo(t testing.TB, method, path string, body []byte, header http.Header, kv ...string) *http.Response {
	t.Helper()
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u := e.http.URL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s = %v", method, u, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// open sends a request that must answer 200 with the framing's content type.
func (e *env) open(t testing.TB, path, method string, body []byte, header http.Header, kv ...string) *stream {
	t.Helper()
	resp := e.httpDo(t, method, path, body, header, kv...)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: status %d %s", method, path, resp.StatusCode, b)
	}
	ndj := strings.HasSuffix(path, "/ndjson")
	want := "text/event-stream"
	if ndj {
		want = "application/x-ndjson"
	}
	if ct := resp.Header.Get("Content-Type"); ct != want {
		t.Fatalf("Content-Type = %q, want %q", ct, want)
	}
	return &stream{t: t, resp: resp, br: bufio.NewReader(resp.Body), ndj: ndj}
}

// post starts runID's turn over HTTP.
func (e *env) post(t testing.TB, path, runID string, sc script) *stream {
	t.Helper()
	return e.open(t, path, http.MethodPost, runFrame(runID, sc), http.Header{"X-Run-Id": {runID}})
}

// next returns the next event, or a frame with err io.EOF at the end of the response.
func (s *stream) next() frame {
	s.t.Helper()
	var id string
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			if line != "" && err == io.EOF {
				s.t.Fatalf("response ended inside a line: %q", line)
			}
			return frame{err: err, code: -1}
		}
		line = strings.TrimSuffix(line, "\n")
		var data string
		switch {
		case s.ndj && line == "":
			s.pings++
			continue
		case s.ndj:
			data = line
		case line == ": ping":
			s.pings++
			continue
		case line == "":
			continue
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
			continue
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
			blank, err := s.br.ReadString('\n')
			if err != nil || blank != "\n" {
				s.t.Fatalf("data line %q not followed by a blank line (%q, %v)", line, blank, err)
			}
		default:
			s.t.Fatalf("unexpected SSE line %q", line)
		}
		if !s.ndj {
			if id != "" {
				data = string(protocol.AppendEnvelope(nil, id, []byte(data)))
			}
		}
		sf, err := protocol.DecodeServerFrame([]byte(data))
		if err != nil {
			s.t.Fatalf("DecodeServerFrame(%s) = %v", data, err)
		}
		return frame{ServerFrame: sf, raw: data, code: -1}
	}
}

// n reads n events.
func (s *stream) n(n int) []frame {
	s.t.Helper()
	var out []frame
	for len(out) < n {
		f := s.next()
		if f.err != nil {
			s.t.Fatalf("response ended after %d events, want %d: %v", len(out), n, f.err)
		}
		out = append(out, f)
	}
	return out
}

// all reads events until the response ends; it must end cleanly.
func (s *stream) all() []frame {
	s.t.Helper()
	var out []frame
	for {
		f := s.next()
		if errors.Is(f.err, io.EOF) {
			return out
		}
		if f.err != nil {
			s.t.Fatalf("response failed after %d events: %v", len(out), f.err)
		}
		out = append(out, f)
	}
}

func TestHTTPTurn(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			runID := "http-" + fr.name
			got := e.post(t, fr.path, runID, script{Tokens: 5}).all()
			if s := summary(got); s != tokenTurn(5) {
				t.Fatalf("events = %s\nwant %s", s, tokenTurn(5))
			}
			distinctOffsets(t, got)
			// One log: the socket replays exactly what the HTTP stream delivered.
			replay, end := e.resume(t, runID, "-1")
			if end.code != 1000 {
				t.Fatalf("resume closed %v", end.err)
			}
			if g, w := strings.Join(raws(replay), "\n"), strings.Join(raws(got), "\n"); g != w {
				t.Fatalf("socket replay differs from the HTTP stream:\n%s\nwant\n%s", g, w)
			}
		})
	}
}

func TestHTTPResume(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, fr := range framings {
		for _, how := range []string{"post", "get"} {
			t.Run(fr.name+"/"+how, func(t *testing.T) {
				runID := "cut-" + fr.name + "-" + how
				sc := script{Tokens: 20, IntervalMs: 10}
				first := e.post(t, fr.path, runID, sc)
				head := first.n(6)
				first.resp.Body.Close() // the connection is cut mid-turn
				last := head[len(head)-1].Offset
				var rest []frame
				if how == "post" {
					h := http.Header{"X-Run-Id": {runID}, "Last-Event-Id": {last}}
					rest = e.open(t, fr.path, http.MethodPost, runFrame(runID, sc), h).all()
				} else {
					rest = e.open(t, fr.path, http.MethodGet, nil, nil, "runId", runID, "offset", last).all()
				}
				got := append(head, rest...)
				if s := summary(got); s != tokenTurn(20) {
					t.Fatalf("events = %s\nwant %s", s, tokenTurn(20))
				}
				distinctOffsets(t, got)
				// The agent ran once: the log holds one turn.
				replay, _ := e.resume(t, runID, "-1")
				if s := summary(replay); s != tokenTurn(20) {
					t.Fatalf("log = %s", s)
				}
			})
		}
	}
}

func TestHTTPJoin(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			runID := "join-" + fr.name
			live := e.post(t, fr.path, runID, script{Tokens: 10, IntervalMs: 20})
			live.n(3)
			running := e.open(t, fr.path, http.MethodGet, nil, nil, "runId", runID, "offset", "-1").all()
			rest := live.all()
			if s := summary(running); s != tokenTurn(10) {
				t.Fatalf("join while running = %s", s)
			}
			if len(rest) != len(running)-3 {
				t.Fatalf("live stream delivered %d events after the first 3, want %d", len(rest), len(running)-3)
			}
			finished := e.open(t, fr.path, http.MethodGet, nil, nil, "runId", runID, "offset", "-1").all()
			if g, w := strings.Join(raws(finished), "\n"), strings.Join(raws(running), "\n"); g != w {
				t.Fatalf("join after the end differs:\n%s\nwant\n%s", g, w)
			}
			// Last-Event-ID wins over ?offset.
			h := http.Header{"Last-Event-Id": {running[4].Offset}}
			after := e.open(t, fr.path, http.MethodGet, nil, h, "runId", runID, "offset", "-1").all()
			if g, w := strings.Join(raws(after), "\n"), strings.Join(raws(running[5:]), "\n"); g != w {
				t.Fatalf("Last-Event-ID replay:\n%s\nwant\n%s", g, w)
			}
			// now: nothing of a closed log.
			if now := e.open(t, fr.path, http.MethodGet, nil, nil, "runId", runID, "offset", "now").all(); len(now) != 0 {
				t.Fatalf("offset now of a closed log = %s", summary(now))
			}
		})
	}
}

func TestHTTPRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.post(t, "/api/chat", "owned", script{Tokens: 1}).all()
	other := http.Header{"X-Principal": {"p2"}}
	cases := []struct {
		name, method, path string
		body               string
		header             http.Header
		query              []string
		status             int
		text               string
	}{
		{"get without offset", "GET", "/api/chat", "", nil, []string{"runId", "owned"}, 400, "a Last-Event-ID header or an offset query parameter is expected"},
		{"get without runId", "GET", "/api/chat/ndjson", "", nil, []string{"offset", "-1"}, 400, "a runId is expected"},
		{"bad offset", "GET", "/api/chat", "", nil, []string{"runId", "owned", "offset", "bogus"}, 400, "invalid offset"},
		{"offset with a space", "GET", "/api/chat", "", nil, []string{"runId", "owned", "offset", "a b"}, 400, "invalid offset"},
		{"unknown run", "GET", "/api/chat", "", nil, []string{"runId", "nope", "offset", "-1"}, 404, "unknown or expired run"},
		{"another principal's run", "GET", "/api/chat", "", other, []string{"runId", "owned", "offset", "-1"}, 404, "unknown or expired run"},
		{"body not JSON", "POST", "/api/chat", "hello", nil, nil, 400, "not JSON"},
		{"abort frame", "POST", "/api/chat", `{"type":"abort","runId":"owned"}`, nil, nil, 400, "conversation socket"},
		{"auth frame", "POST", "/api/chat", `{"type":"auth","token":"a.b.c"}`, nil, nil, 400, "conversation socket"},
		{"runId mismatch", "POST", "/api/chat", string(runFrame("a", script{})), http.Header{"X-Run-Id": {"b"}}, nil, 400, "X-Run-Id"},
		{"foreign origin", "GET", "/api/chat", "", http.Header{"Origin": {"https://evil.example"}}, []string{"runId", "owned", "offset", "-1"}, 403, "origin not allowed"},
		{"method", "PUT", "/api/chat", "", nil, nil, 405, "method not allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.httpDo(t, tc.method, tc.path, []byte(tc.body), tc.header, tc.query...)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.text) {
				t.Fatalf("status %d %q, want %d containing %q", resp.StatusCode, b, tc.status, tc.text)
			}
		})
	}
	// Invalid input and another principal's runId are answered as on a socket: one bare
	// RUN_ERROR.
	bare := []struct {
		name   string
		body   []byte
		header http.Header
		want   string
	}{
		{"invalid input", []byte(`{"threadId":"t","runId":"r","messages":"no"}`), nil, "bare RUN_ERROR:invalid_input"},
		{"forbidden", runFrame("owned", script{Tokens: 1}), other, "bare RUN_ERROR:forbidden"},
	}
	for _, fr := range framings {
		for _, tc := range bare {
			t.Run(fr.name+"/"+tc.name, func(t *testing.T) {
				if s := summary(e.open(t, fr.path, http.MethodPost, tc.body, tc.header).all()); s != tc.want {
					t.Fatalf("events = %s, want %s", s, tc.want)
				}
			})
		}
	}
}

// TestHTTPSocketInterop: a turn started over HTTP resumes over the socket, and the reverse.
func TestHTTPSocketInterop(t *testing.T) {
	e := newEnv(t, envOptions{})
	sc := script{Tokens: 16, IntervalMs: 10}
	for _, fr := range framings {
		t.Run(fr.name+"/http-then-socket", func(t *testing.T) {
			runID := "h2s-" + fr.name
			live := e.post(t, fr.path, runID, sc)
			head := live.n(5)
			live.resp.Body.Close()
			rest, end := e.resume(t, runID, head[4].Offset)
			if end.code != 1000 {
				t.Fatalf("resume closed %v", end.err)
			}
			got := append(head, rest...)
			if s := summary(got); s != tokenTurn(16) {
				t.Fatalf("events = %s", s)
			}
			distinctOffsets(t, got)
		})
		t.Run(fr.name+"/socket-then-http", func(t *testing.T) {
			runID := "s2h-" + fr.name
			cl := dial(t, e.url(), "")
			cl.send(runFrame(runID, sc))
			head := cl.untilN(t, 5)
			cl.c.CloseNow()
			h := http.Header{"X-Run-Id": {runID}, "Last-Event-Id": {head[4].Offset}}
			rest := e.open(t, fr.path, http.MethodPost, runFrame(runID, sc), h).all()
			got := append(head, rest...)
			if s := summary(got); s != tokenTurn(16) {
				t.Fatalf("events = %s", s)
			}
			distinctOffsets(t, got)
		})
	}
}

// TestHTTPSlowClient: a client that cannot absorb the turn's bursts gets the rest from the
// log, complete and without duplicates.
// TestHTTPSlowClient: a client too slow for a turn's burst gets the rest from the log, on
// every framing (AGUI without the marker), complete and without a duplicate.
func TestHTTPSlowClient(t *testing.T) {
	e := newEnv(t, envOptions{queueSize: 2})
	type slowCase struct {
		name, path string
		want       func(int) string
	}
	cases := []slowCase{{"agui", "/agui", aguiTurn}}
	for _, fr := range framings {
		cases = append(cases, slowCase{fr.name, fr.path, tokenTurn})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := e.post(t, c.path, "slow-"+c.name, script{Tokens: 600, DeltaBytes: 16384})
			head := st.n(2)
			time.Sleep(300 * time.Millisecond) // the turn runs ahead meanwhile
			got := append(head, st.all()...)
			if s := summary(got); s != c.want(600) {
				t.Fatalf("events = %.300s…", s)
			}
			distinctOffsets(t, got)
		})
	}
	// Every stream overflowed its queue, or this test proved nothing.
	if n := e.metric(t, "wsgateway_conversation_frames_dropped_total", "slow_consumer"); n != float64(len(cases)) {
		t.Fatalf("slow-consumer overflows = %v, want %d", n, len(cases))
	}
}

func TestHTTPHeartbeat(t *testing.T) {
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: 50 * time.Millisecond}})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			st := e.post(t, fr.path, "hb-"+fr.name, script{Tokens: 8, IntervalMs: 60})
			if s := summary(st.all()); s != tokenTurn(8) {
				t.Fatalf("events = %s", s)
			}
			if st.pings == 0 {
				t.Fatalf("no heartbeat during a 500ms turn with a 50ms interval")
			}
		})
	}
}

// TestHTTPShutdown: Shutdown ends a tailing replay at once, and lets a live turn finish
// into its response.
func TestHTTPShutdown(t *testing.T) {
	e := newEnv(t, envOptions{})
	live := e.post(t, "/api/chat", "drain", script{Tokens: 10, IntervalMs: 30})
	live.n(2)
	tail := e.open(t, "/api/chat/ndjson", http.MethodGet, nil, nil, "runId", "drain", "offset", "now")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- e.srv.Shutdown(ctx)
	}()
	tail.all() // ends although the log is still open
	rest := live.all()
	if got := 2 + len(rest); got != len(strings.Fields(tokenTurn(10))) {
		t.Fatalf("live stream got %d events, want the whole turn: %s", got, summary(rest))
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown() = %v", err)
	}
	resp := e.httpDo(t, http.MethodGet, "/api/chat", nil, nil, "runId", "drain", "offset", "-1")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("after Shutdown: status %d, want 503", resp.StatusCode)
	}
}

// TestHTTPClientLeaves: the turn outlives its response, unless AbortOnDisconnect.
func TestHTTPClientLeaves(t *testing.T) {
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abortOnDisconnect=%v", abort), func(t *testing.T) {
			e := newEnv(t, envOptions{abortOnDisconnect: abort})
			st := e.post(t, "/api/chat", "leaves", script{Tokens: 10, IntervalMs: 30})
			st.n(3)
			st.resp.Body.Close()
			e.waitClosed(t, "leaves")
			replay, _ := e.resume(t, "leaves", "-1")
			got := summary(replay)
			if !abort && got != tokenTurn(10) {
				t.Fatalf("log = %s, want the whole turn", got)
			}
			if abort && (!strings.HasSuffix(got, " RUN_ERROR:aborted") || len(replay) >= len(strings.Fields(tokenTurn(10)))) {
				t.Fatalf("log = %s, want the turn aborted midway", got)
			}
		})
	}
}

// TestHTTPOutlivesServerTimeouts: a stream lasts longer than the HTTP server's read and
// write timeouts, which bound plain requests only.
func TestHTTPOutlivesServerTimeouts(t *testing.T) {
	e := newEnv(t, envOptions{serverTimeout: 300 * time.Millisecond})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			if s := summary(e.post(t, fr.path, "long-"+fr.name, script{Tokens: 10, IntervalMs: 100}).all()); s != tokenTurn(10) {
				t.Fatalf("events = %s", s)
			}
			if s := summary(e.open(t, fr.path, http.MethodGet, nil, nil, "runId", "long-"+fr.name, "offset", "-1").all()); s != tokenTurn(10) {
				t.Fatalf("replay = %s", s)
			}
		})
	}
}

// BenchmarkHTTPTurn measures one turn of 1000 deltas from POST to the end of its response,
// and reports events per second as the client reads them.
//
//	go test -run '^$' -bench HTTPTurn -benchtime 20x ./conversation/
func BenchmarkHTTPTurn(b *testing.B) {
	e := newEnv(b, envOptions{})
	for _, fr := range framings {
		b.Run(fr.name, func(b *testing.B) {
			events := 0
			start := time.Now()
			for i := range b.N {
				got := e.post(b, fr.path, fmt.Sprintf("bench-%s-%d", fr.name, i), script{Tokens: 1000}).all()
				if len(got) != 1005 {
					b.Fatalf("got %d events, want 1005", len(got))
				}
				events += len(got)
			}
			b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// TestHTTPMetrics checks that HTTP streams count as open sockets and resumes, by transport.
func TestHTTPMetrics(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			runID := "metrics-" + fr.name
			live := e.post(t, fr.path, runID, script{Tokens: 10, IntervalMs: 20})
			live.n(2)
			e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation,"+fr.name, 1)
			live.all()
			e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation,"+fr.name, 0)

			e.open(t, fr.path, http.MethodGet, nil, nil, "runId", runID, "offset", "-1").all()
			e.waitMetric(t, "wsgateway_conversation_resumes_total", "completed,"+fr.name, 1)
			e.waitMetric(t, "wsgateway_conversation_open_sockets", "resume,"+fr.name, 0)
			resp := e.httpDo(t, http.MethodGet, fr.path, nil, nil, "runId", "no-such-run", "offset", "-1")
			resp.Body.Close()
			e.waitMetric(t, "wsgateway_conversation_resumes_total", "unknown_run,"+fr.name, 1)
			if n := e.metric(t, "wsgateway_conversation_resumes_total", "completed,websocket"); n != 0 {
				t.Errorf("resumes_total{completed,websocket} = %v after HTTP replays only, want 0", n)
			}
		})
	}
}
