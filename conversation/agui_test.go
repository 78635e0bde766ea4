package conversation_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
)

// The AGUI framing: server-sent events as on /api/chat, without the run.accepted marker.

// aguiTurn is tokenTurn(n) as the AGUI framing writes it: without the marker.
func aguiTurn(n int) string { return strings.TrimPrefix(tokenTurn(n), "CUSTOM:run.accepted ") }

// TestAGUITurn: a POST streams the turn from RUN_STARTED, each event with its offset; the
// log, read over the socket, holds the marker, then the same events at the same offsets.
func TestAGUITurn(t *testing.T) {
	e := newEnv(t, envOptions{})
	got := e.post(t, "/agui", "agui-turn", script{Tokens: 5}).all()
	if s := summary(got); s != aguiTurn(5) {
		t.Fatalf("events = %s\nwant %s", s, aguiTurn(5))
	}
	distinctOffsets(t, got)
	replay, end := e.resume(t, "agui-turn", "-1")
	if end.code != 1000 {
		t.Fatalf("resume closed %v", end.err)
	}
	if s := summary(replay); s != tokenTurn(5) {
		t.Fatalf("log = %s, want %s", s, tokenTurn(5))
	}
	if g, w := strings.Join(raws(replay[1:]), "\n"), strings.Join(raws(got), "\n"); g != w {
		t.Fatalf("the log after its marker differs from the AGUI stream:\n%s\nwant\n%s", g, w)
	}
	// The transport has a metrics label of its own.
	e.open(t, "/agui", http.MethodGet, nil, nil, "runId", "agui-turn", "offset", "-1").all()
	e.waitMetric(t, "wsgateway_conversation_resumes_total", "completed,agui", 1)
	e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation,agui", 0)
}

// TestAGUIResume: a cut stream goes on after its last id, by POST with Last-Event-ID or by
// GET, without a duplicate; a join from -1 or from the marker's offset starts at RUN_STARTED.
func TestAGUIResume(t *testing.T) {
	e := newEnv(t, envOptions{})
	sc := script{Tokens: 20, IntervalMs: 10}
	for _, how := range []string{"post", "get"} {
		t.Run(how, func(t *testing.T) {
			runID := "agui-cut-" + how
			first := e.post(t, "/agui", runID, sc)
			head := first.n(5)
			first.resp.Body.Close()
			last := head[len(head)-1].Offset
			var rest []frame
			if how == "post" {
				rest = e.open(t, "/agui", http.MethodPost, runFrame(runID, sc), http.Header{"Last-Event-Id": {last}}).all()
			} else {
				rest = e.open(t, "/agui", http.MethodGet, nil, nil, "runId", runID, "offset", last).all()
			}
			got := append(head, rest...)
			if s := summary(got); s != aguiTurn(20) {
				t.Fatalf("events = %s\nwant %s", s, aguiTurn(20))
			}
			distinctOffsets(t, got)
			all := e.open(t, "/agui", http.MethodGet, nil, nil, "runId", runID, "offset", "-1").all()
			if g, w := strings.Join(raws(all), "\n"), strings.Join(raws(got), "\n"); g != w {
				t.Fatalf("join from -1:\n%s\nwant\n%s", g, w)
			}
			log, _ := e.resume(t, runID, "-1")
			fromMarker := e.open(t, "/agui", http.MethodGet, nil, nil, "runId", runID, "offset", log[0].Offset).all()
			if g, w := strings.Join(raws(fromMarker), "\n"), strings.Join(raws(got), "\n"); g != w {
				t.Fatalf("join after the marker:\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// TestAGUISocketInterop: a turn started over AGUI is joined on the socket, and a turn started
// on the socket is joined over AGUI; both see the same offsets.
func TestAGUISocketInterop(t *testing.T) {
	e := newEnv(t, envOptions{})
	sc := script{Tokens: 12, IntervalMs: 10}

	live := e.post(t, "/agui", "agui-to-ws", sc)
	head := live.n(3)
	joined, end := e.resume(t, "agui-to-ws", head[2].Offset)
	if end.code != 1000 {
		t.Fatalf("resume closed %v", end.err)
	}
	if s := summary(append(head, joined...)); s != aguiTurn(12) {
		t.Fatalf("AGUI head + socket rest = %s", s)
	}
	if rest := live.all(); strings.Join(raws(rest), "\n") != strings.Join(raws(joined), "\n") {
		t.Fatalf("the AGUI stream and the socket differ after %s", head[2].Offset)
	}

	cl := dial(t, e.url(), "")
	cl.send(runFrame("ws-to-agui", sc))
	first := cl.untilN(t, 4) // the marker, RUN_STARTED, TEXT_MESSAGE_START, one delta
	cl.c.CloseNow()
	rest := e.open(t, "/agui", http.MethodGet, nil, nil, "runId", "ws-to-agui", "offset", first[3].Offset).all()
	got := append(first[1:], rest...)
	if s := summary(got); s != aguiTurn(12) {
		t.Fatalf("socket head + AGUI rest = %s", s)
	}
	distinctOffsets(t, got)
}

// TestAGUIRefused: a start the gateway refuses is one bare RUN_ERROR, the first and only
// event, which @ag-ui/client's verifier accepts in first place.
func TestAGUIRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.post(t, "/agui", "agui-owned", script{Tokens: 1}).all()
	for _, tc := range []struct {
		name   string
		body   []byte
		header http.Header
		want   string
	}{
		{"invalid input", []byte(`{"threadId":"t","runId":"r","messages":"no"}`), nil, "bare RUN_ERROR:invalid_input"},
		{"forbidden", runFrame("agui-owned", script{Tokens: 1}), http.Header{"X-Principal": {"p2"}}, "bare RUN_ERROR:forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s := summary(e.open(t, "/agui", http.MethodPost, tc.body, tc.header).all()); s != tc.want {
				t.Fatalf("events = %s, want %s", s, tc.want)
			}
		})
	}
}

// TestHTTPAbort: DELETE ?runId= aborts the principal's running turn, whichever transport
// started it, and answers once it ended; every stream of the turn ends with RUN_ERROR
// aborted. Another principal's DELETE finds nothing; a second one answers the outcome again.
func TestHTTPAbort(t *testing.T) {
	e := newEnv(t, envOptions{})
	del := func(path, runID string, header http.Header) int {
		t.Helper()
		var kv []string
		if runID != "" {
			kv = []string{"runId", runID}
		}
		resp := e.httpDo(t, http.MethodDelete, path, nil, header, kv...)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if want := `{"runId":"` + runID + `","outcome":"aborted"}`; resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) != want {
			t.Errorf("DELETE answered %s, want %s", body, want)
		}
		return resp.StatusCode
	}
	st := e.post(t, "/agui", "agui-abort", script{Tokens: 2, Block: true})
	st.n(3)
	if code := del("/agui", "agui-abort", http.Header{"X-Principal": {"p2"}}); code != http.StatusNotFound {
		t.Fatalf("DELETE by another principal = %d, want 404", code)
	}
	if code := del("/agui", "", nil); code != http.StatusBadRequest {
		t.Fatalf("DELETE without runId = %d, want 400", code)
	}
	if code := del("/agui", "agui-abort", nil); code != http.StatusOK {
		t.Fatalf("DELETE = %d, want 200", code)
	}
	rest := st.all()
	if s := summary(rest); s != "TEXT_MESSAGE_CONTENT RUN_ERROR:aborted" {
		t.Fatalf("after the abort: %s, want the last delta and RUN_ERROR aborted", s)
	}
	e.waitClosed(t, "agui-abort")
	if code := del("/agui", "agui-abort", nil); code != http.StatusOK {
		t.Fatalf("DELETE of an ended turn = %d, want 200 with its outcome", code)
	}

	// A socket's turn, aborted over HTTP: as after an abort frame, the socket gets nothing
	// more live, and the log ends with RUN_ERROR aborted.
	cl := dial(t, e.url(), "")
	cl.send(runFrame("ws-abort", script{Tokens: 1, Block: true}))
	cl.untilN(t, 4)
	if code := del("/api/chat", "ws-abort", nil); code != http.StatusOK {
		t.Fatalf("DELETE of a socket's turn = %d, want 200", code)
	}
	e.waitClosed(t, "ws-abort")
	if log, _ := e.resume(t, "ws-abort", "-1"); !strings.HasSuffix(summary(log), "TEXT_MESSAGE_CONTENT RUN_ERROR:aborted") {
		t.Fatalf("log of the socket's turn = %s, want it aborted", summary(log))
	}
}

// heldCreates is a Store whose log creations wait until release is closed.
type heldCreates struct {
	conversation.Store
	started chan struct{} // a creation is waiting
	release chan struct{}
}

func (h *heldCreates) Create(ctx context.Context, principal, runID, threadID string, input []byte) (conversation.RunLog, error) {
	h.started <- struct{}{}
	<-h.release
	return h.Store.Create(ctx, principal, runID, threadID, input)
}

// TestHTTPAbortWhileStarting: a DELETE that arrives while the turn's log is being created
// aborts the turn as it starts; its response, which received nothing yet, gets the whole log
// (on AGUI, without the marker): RUN_ERROR aborted.
func TestHTTPAbortWhileStarting(t *testing.T) {
	hc := &heldCreates{started: make(chan struct{}, 1), release: make(chan struct{})}
	e := newEnv(t, envOptions{wrap: func(s conversation.Store) conversation.Store {
		hc.Store = s
		return hc
	}})
	done := make(chan []frame, 1)
	go func() {
		done <- e.post(t, "/agui", "abort-early", script{Tokens: 3}).all()
	}()
	select {
	case <-hc.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the POST did not start creating the log")
	}
	deleted := make(chan int, 1)
	go func() {
		resp := e.httpDo(t, http.MethodDelete, "/agui", nil, nil, "runId", "abort-early")
		resp.Body.Close()
		deleted <- resp.StatusCode
	}()
	for deadline := time.Now().Add(20 * time.Second); !e.srv.AbortRequested("p1", "abort-early"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the DELETE did not reach the starting turn")
		}
	}
	close(hc.release)
	if code := <-deleted; code != http.StatusOK {
		t.Fatalf("DELETE while starting = %d, want 200", code)
	}
	select {
	case got := <-done:
		if s := summary(got); s != "RUN_ERROR:aborted" {
			t.Fatalf("events = %s, want RUN_ERROR:aborted", s)
		}
		distinctOffsets(t, got)
	case <-time.After(20 * time.Second):
		t.Fatal("the response did not end")
	}
}
