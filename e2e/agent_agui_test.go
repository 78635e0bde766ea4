package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// aguiTurn is what agui-server.mjs reports of one turn: the events it sent, and the events
// @ag-ui/client 1.0.0 expands them to.
type aguiTurn struct {
	RunID    string           `json:"runId"`
	Sent     []map[string]any `json:"sent"`
	Expanded []map[string]any `json:"expanded"`
}

// aguiServer is a running testdata/npm/agui-server.mjs.
type aguiServer struct {
	URL string

	mu    sync.Mutex
	turns map[string]aguiTurn
	ready chan struct{} // closed when a turn is reported
}

// startAGUIServer starts the Node AG-UI server on a free loopback port. It stops when the test
// ends (its stdin is closed; it is killed, by its pid, if it has not exited 10s later).
func startAGUIServer(tb testing.TB) *aguiServer {
	tb.Helper()
	dir := npmDir(tb)
	cmd := exec.Command("node", "agui-server.mjs", "--port", "0", "--lifetime", "600", "--exit-with-stdin")
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("node agui-server.mjs: %v", err)
	}
	s := &aguiServer{turns: map[string]aguiTurn{}, ready: make(chan struct{})}
	listening := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var line struct {
				Listening string    `json:"listening"`
				Turn      *aguiTurn `json:"turn"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				continue
			}
			if line.Listening != "" {
				listening <- line.Listening
			}
			if line.Turn != nil {
				s.mu.Lock()
				s.turns[line.Turn.RunID] = *line.Turn
				close(s.ready)
				s.ready = make(chan struct{})
				s.mu.Unlock()
			}
		}
	}()
	tb.Cleanup(func() {
		stdin.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		<-readDone
		if tb.Failed() {
			tb.Logf("agui-server.mjs stderr:\n%s", stderr.String())
		}
	})
	select {
	case s.URL = <-listening:
	case <-readDone:
		tb.Fatalf("agui-server.mjs exited before listening:\n%s", stderr.String())
	case <-time.After(nodeTimeout):
		tb.Fatalf("agui-server.mjs did not listen within %v", nodeTimeout)
	}
	return s
}

// turn waits for the server's report of runID.
func (s *aguiServer) turn(tb testing.TB, ctx context.Context, runID string) aguiTurn {
	tb.Helper()
	for {
		s.mu.Lock()
		t, ok := s.turns[runID]
		ready := s.ready
		s.mu.Unlock()
		if ok {
			return t
		}
		select {
		case <-ready:
		case <-ctx.Done():
			tb.Fatalf("agui-server.mjs reported no turn %s", runID)
		}
	}
}

// aguiRunFrame is a run frame of the thread th-agent with one user message and forwardedProps
// props (JSON).
func aguiRunFrame(runID, text, props string) []byte {
	q, _ := json.Marshal(text)
	return []byte(`{"threadId":"th-agent","runId":"` + runID + `","messages":[{"id":"u-` + runID + `","role":"user","content":` + string(q) + `}],"forwardedProps":` + props + `}`)
}

// readUntilTerminal reads c's envelopes until one holds RUN_FINISHED or RUN_ERROR and returns
// their events; a bare event or a close fails the test.
func readUntilTerminal(tb testing.TB, ctx context.Context, c *websocket.Conn) []map[string]any {
	tb.Helper()
	events, err := readTerminal(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	return events
}

// readTerminal is readUntilTerminal for goroutines other than the test's: it returns the
// failure.
func readTerminal(ctx context.Context, c *websocket.Conn) ([]map[string]any, error) {
	var events []map[string]any
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return events, fmt.Errorf("read after %d events (%s): %w", len(events), eventTypes(events), err)
		}
		var env struct {
			ID    string         `json:"id"`
			Chunk map[string]any `json:"chunk"`
			Type  string         `json:"type"`
		}
		if err := json.Unmarshal(data, &env); err != nil {
			return events, fmt.Errorf("frame is not JSON: %s", data)
		}
		if env.Type == "ping" {
			continue
		}
		if env.Chunk == nil || env.ID == "" {
			return events, fmt.Errorf("frame is not an envelope: %s", data)
		}
		events = append(events, env.Chunk)
		if t := env.Chunk["type"]; t == "RUN_FINISHED" || t == "RUN_ERROR" {
			return events, nil
		}
	}
}

// sameEventList fails the test unless got and want hold the same events (as JSON values).
func sameEventList(tb testing.TB, what string, got, want []map[string]any) {
	tb.Helper()
	mask := func(events []map[string]any) []map[string]any {
		in := make([]any, len(events))
		for i, e := range events {
			in[i] = e
		}
		out := make([]map[string]any, len(events))
		for i, e := range maskCreatedAt(in) {
			out[i] = e.(map[string]any)
		}
		return out
	}
	got, want = mask(got), mask(want)
	if reflect.DeepEqual(got, want) {
		return
	}
	var b strings.Builder
	for i := 0; i < len(got) || i < len(want); i++ {
		var g, w []byte
		if i < len(got) {
			g, _ = json.Marshal(got[i])
		}
		if i < len(want) {
			w, _ = json.Marshal(want[i])
		}
		mark := "  "
		if string(g) != string(w) {
			mark = "≠ "
		}
		fmt.Fprintf(&b, "%s%3d got  %s\n     want %s\n", mark, i, g, w)
	}
	tb.Errorf("%s: events differ\n%s", what, b.String())
}

// TestAGUIAgentNodeServer runs turns through a gateway whose agent is a real AG-UI server
// written with @ag-ui/encoder: the events a client receives live, and those a client joining
// the run's log receives, equal what the server sent as @ag-ui/client expands it, after the
// gateway's run.accepted marker. Two sockets run turns of one thread at the same time
// (multitaskStrategy concurrent), several turns each.
func TestAGUIAgentNodeServer(t *testing.T) {
	srv := startAGUIServer(t)
	gw := startGateway(t, "--agent", "agui", "--agent-url", srv.URL, "--agent-header", "X-Static: s1",
		"--agent-forward-headers", "X-Client-Tag")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("sockets", func(t *testing.T) {
		for sock := range 2 {
			t.Run(fmt.Sprint(sock), func(t *testing.T) {
				t.Parallel()
				aguiSocketTurns(t, ctx, gw, srv, sock)
			})
		}
	})
}

// aguiSocketTurns runs three turns on one socket and checks each against the server's report.
func aguiSocketTurns(t *testing.T, ctx context.Context, gw *gateway, srv *aguiServer, sock int) {
	tag := fmt.Sprintf("socket-%d", sock)
	c, _, err := websocket.Dial(ctx, gw.WS, &websocket.DialOptions{HTTPHeader: http.Header{"X-Client-Tag": {tag}}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	for turn := range 3 {
		runID := fmt.Sprintf("agui-node-%d-%d", sock, turn)
		text := fmt.Sprintf("Wetter in Zürich? #%d «%d»", turn, sock)
		props := `{"intervalMs":` + fmt.Sprint(turn*3) + `,"echoHeaders":["X-Static","X-Client-Tag","X-Absent"]}`
		if err := c.Write(ctx, websocket.MessageText, concurrent(aguiRunFrame(runID, text, props))); err != nil {
			t.Fatalf("write: %v", err)
		}
		live := readUntilTerminal(t, ctx, c)
		ref := srv.turn(t, ctx, runID)
		if len(live) == 0 || live[0]["type"] != "CUSTOM" || live[0]["name"] != "run.accepted" {
			t.Errorf("%s: first event %v, want the run.accepted marker", runID, live)
			return
		}
		sameEventList(t, runID+" live", live[1:], ref.Expanded)
		sameEventList(t, runID+" joined", joinLog(t, ctx, gw, runID)[1:], ref.Expanded)

		// What the test asserts must be in the reference too: the chunks were
		// expanded, the user's text, the static header and the forwarded header of this
		// socket's handshake made the trip.
		var types []string
		for _, e := range ref.Sent {
			types = append(types, e["type"].(string))
		}
		if !strings.Contains(strings.Join(types, " "), "TEXT_MESSAGE_CHUNK") || eventTypes(ref.Expanded) == strings.Join(types, " ") {
			t.Errorf("%s: the server sent no chunk to expand: %s", runID, types)
		}
		wantHeaders := map[string]any{"X-Static": "s1", "X-Client-Tag": tag, "X-Absent": nil}
		found := false
		for _, e := range live {
			if e["type"] == "CUSTOM" && e["name"] == "headers" {
				found = reflect.DeepEqual(e["value"], wantHeaders)
			}
			if e["type"] == "TEXT_MESSAGE_CONTENT" && e["delta"] == text {
				text = "" // seen
			}
		}
		if !found || text != "" {
			t.Errorf("%s: the upstream did not get the static and forwarded headers or the text: %v", runID, live)
		}
	}
}

// faultUpstream is a Go AG-UI server whose forwardedProps.fault chooses how it fails.
type faultUpstream struct {
	*httptest.Server
	cancelled chan string // runIds whose request the gateway cancelled
}

// aguiEvents writes SSE events: RUN_STARTED for runID, then n TEXT_MESSAGE_CONTENT of one
// message, interval apart, then (when finish) the end of the message and RUN_FINISHED.
func aguiEvents(w http.ResponseWriter, r *http.Request, runID string, n int, interval time.Duration, finish bool) bool {
	send := func(ev string) bool {
		if _, err := io.WriteString(w, "data: "+ev+"\n\n"); err != nil {
			return false
		}
		w.(http.Flusher).Flush()
		return r.Context().Err() == nil
	}
	if !send(`{"type":"RUN_STARTED","threadId":"th-agent","runId":"`+runID+`"}`) ||
		!send(`{"type":"TEXT_MESSAGE_START","messageId":"m-`+runID+`","role":"assistant"}`) {
		return false
	}
	for i := 1; i <= n; i++ {
		if interval > 0 {
			select {
			case <-time.After(interval):
			case <-r.Context().Done():
				return false
			}
		}
		if !send(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m-%s","delta":"t%d "}`, runID, i)) {
			return false
		}
	}
	if finish {
		return send(`{"type":"TEXT_MESSAGE_END","messageId":"m-`+runID+`"}`) &&
			send(`{"type":"RUN_FINISHED","threadId":"th-agent","runId":"`+runID+`"}`)
	}
	return true
}

func startFaultUpstream(tb testing.TB) *faultUpstream {
	tb.Helper()
	u := &faultUpstream{cancelled: make(chan string, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			RunID          string `json:"runId"`
			ForwardedProps struct {
				Fault string `json:"fault"`
				N     int    `json:"n"`
				Ms    int    `json:"ms"`
			} `json:"forwardedProps"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		io.Copy(io.Discard, r.Body)
		p := in.ForwardedProps
		stream := func() { w.Header().Set("Content-Type", "text/event-stream"); w.WriteHeader(http.StatusOK) }
		switch p.Fault {
		case "":
			stream()
			aguiEvents(w, r, in.RunID, p.N, time.Duration(p.Ms)*time.Millisecond, true)
		case "status":
			http.Error(w, `{"detail":"model backend unavailable"}`, http.StatusServiceUnavailable)
		case "html":
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, "<!doctype html><title>Sign in</title>")
		case "malformed":
			stream()
			aguiEvents(w, r, in.RunID, 2, 0, false)
			io.WriteString(w, "data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"delta\":'single quotes'}\n\n")
		case "oversized":
			stream()
			aguiEvents(w, r, in.RunID, 1, 0, false)
			io.WriteString(w, `data: {"type":"CUSTOM","name":"blob","value":"`+strings.Repeat("x", 8<<10)+`"}`+"\n\n")
		case "stall", "hang":
			stream()
			if aguiEvents(w, r, in.RunID, 1, 0, false) {
				<-r.Context().Done()
			}
			if p.Fault == "hang" {
				u.cancelled <- in.RunID
			}
		case "silent":
			<-r.Context().Done()
		case "cut":
			stream()
			aguiEvents(w, r, in.RunID, 2, 0, false)
		}
	}))
	tb.Cleanup(u.Close)
	return u
}

// TestAGUIAgentFaults sends turns whose upstream fails in each way the agui agent must
// report, on one socket, one after the other, each followed by a good turn on the same socket,
// while a slow good turn of the same thread runs on another socket the whole time (the
// others name multitaskStrategy concurrent to run beside it). Every failed turn ends with
// the RUN_ERROR that says what happened, both live and in its log; the socket and the other
// turns go on as if nothing happened.
func TestAGUIAgentFaults(t *testing.T) {
	up := startFaultUpstream(t)
	gw := startGateway(t, "--agent", "agui", "--agent-url", up.URL+"/agent",
		"--agent-first-event-timeout", "1s", "--agent-gap-timeout", "1s", "--max-event-bytes", "4KiB")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The steady turn: 80 deltas 50 ms apart, longer than all the faults together.
	steadyDone := make(chan []map[string]any, 1)
	steady, _, err := websocket.Dial(ctx, gw.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer steady.CloseNow()
	if err := steady.Write(ctx, websocket.MessageText, aguiRunFrame("agui-steady", "go", `{"n":80,"ms":50}`)); err != nil {
		t.Fatal(err)
	}
	steadyErr := make(chan error, 1)
	go func() {
		events, err := readTerminal(ctx, steady)
		steadyErr <- err
		steadyDone <- events
	}()

	c, _, err := websocket.Dial(ctx, gw.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	tests := []struct {
		fault  string
		before string // event types before the RUN_ERROR, after the marker
		msg    string // the RUN_ERROR's message
		code   string
	}{
		{"status", "", `agui agent: the upstream answered 503 Service Unavailable: {"detail":"model backend unavailable"}`, "agent_error"},
		{"html", "", "agui agent: the upstream did not answer with text/event-stream (text/html): <!doctype html><title>Sign in</title>", "agent_error"},
		{"malformed", "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT",
			`agui agent: the upstream sent an event that is not a JSON object: {"type":"TEXT_MESSAGE_CONTENT","delta":'single quotes'}`, "agent_error"},
		{"oversized", "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT",
			"agui agent: an upstream event is too large: more than 4096 bytes", "agent_error"},
		{"stall", "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT",
			"agui agent: the upstream stream stalled: nothing received for 1s", "agent_error"},
		{"silent", "", "agui agent: no event from the upstream within 1s", "agent_error"},
		{"cut", "RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT",
			"agent stream ended without a terminal event", "incomplete"},
	}
	for i, tt := range tests {
		runID := fmt.Sprintf("agui-fault-%d-%s", i, tt.fault)
		if err := c.Write(ctx, websocket.MessageText, concurrent(aguiRunFrame(runID, "x", `{"fault":"`+tt.fault+`"}`))); err != nil {
			t.Fatal(err)
		}
		live := readUntilTerminal(t, ctx, c)
		joined := joinLog(t, ctx, gw, runID)
		sameEventList(t, runID+" joined vs live", joined, live)
		wantTypes := strings.Join(strings.Fields("CUSTOM "+tt.before+" RUN_ERROR"), " ")
		last := live[len(live)-1]
		if got := eventTypes(live); got != wantTypes || last["message"] != tt.msg || last["code"] != tt.code {
			t.Errorf("fault %s: events %s ending %v\nwant %s ending RUN_ERROR{message: %q, code: %s}", tt.fault, got, last, wantTypes, tt.msg, tt.code)
		}

		// The same socket serves the next turn as if nothing had happened.
		okID := runID + "-then-ok"
		if err := c.Write(ctx, websocket.MessageText, concurrent(aguiRunFrame(okID, "x", `{"n":3}`))); err != nil {
			t.Fatal(err)
		}
		if got := eventTypes(readUntilTerminal(t, ctx, c)); got != "CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" {
			t.Errorf("after fault %s, a good turn on the same socket gave %s", tt.fault, got)
		}
	}

	// The steady turn, on its own socket, got every delta once, in order.
	var events []map[string]any
	if err := <-steadyErr; err != nil {
		t.Fatalf("steady turn: %v", err)
	}
	events = <-steadyDone
	var deltas []string
	for _, e := range events {
		if e["type"] == "TEXT_MESSAGE_CONTENT" {
			deltas = append(deltas, e["delta"].(string))
		}
	}
	var want []string
	for i := 1; i <= 80; i++ {
		want = append(want, fmt.Sprintf("t%d ", i))
	}
	if !reflect.DeepEqual(deltas, want) || events[len(events)-1]["type"] != "RUN_FINISHED" {
		t.Errorf("steady turn: %d deltas ending %v; want t1 … t80 then RUN_FINISHED", len(deltas), events[len(events)-1])
	}
}

// TestAGUIAgentAbortCancelsUpstream: an abort frame stops the turn, cancels the upstream
// request at once, and the run's log ends with RUN_ERROR aborted.
func TestAGUIAgentAbortCancelsUpstream(t *testing.T) {
	up := startFaultUpstream(t)
	gw := startGateway(t, "--agent", "agui", "--agent-url", up.URL+"/agent")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, gw.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, aguiRunFrame("agui-abort", "x", `{"fault":"hang"}`)); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 4; n++ { // run.accepted, RUN_STARTED, TEXT_MESSAGE_START, one delta
		if _, _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"abort","runId":"agui-abort"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-up.cancelled:
		if id != "agui-abort" {
			t.Errorf("cancelled upstream request of %s, want agui-abort", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled by the abort")
	}
	log := joinLog(t, ctx, gw, "agui-abort")
	last := log[len(log)-1]
	if last["type"] != "RUN_ERROR" || last["code"] != "aborted" {
		t.Errorf("log of the aborted turn ends with %v, want RUN_ERROR code aborted", last)
	}
}
