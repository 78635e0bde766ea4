package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// @ag-ui/client 1.0.0's HttpAgent, unchanged, against the AG-UI transport of a real gateway
// process (POST /agui): these tests run testdata/npm/agui-http.mjs and compare what the
// client's user sees with the demo agent's events, the run's log, and what the same client
// builds from an @ag-ui/encoder server streaming the demo agent's events directly.

const aguiHTTPScript = "agui-http.mjs"

// aguiRun is the result of agui-http.mjs.
type aguiRun struct {
	Events       []map[string]any `json:"events"` // as the subscriber's onEvent saw them
	Wire         []aguiWire       `json:"wire"`
	NewMessages  []map[string]any `json:"newMessages"`
	RunErrors    []map[string]any `json:"runErrors"`
	Failed       *string          `json:"failed"`
	Requests     []httpRequest    `json:"requests"`
	DeleteStatus *int             `json:"deleteStatus"`
	Comments     int              `json:"comments"` // heartbeats on the wire
}

// aguiWire is one server-sent event as the response carried it: its id line (nil for none)
// and its data.
type aguiWire struct {
	ID    *string        `json:"id"`
	Event map[string]any `json:"event"`
}

// runAGUI runs a scenario of agui-http.mjs with opts; onProgress may be nil.
func runAGUI(tb testing.TB, scenario string, onProgress func(), opts map[string]any) aguiRun {
	tb.Helper()
	var res aguiRun
	progress := func(json.RawMessage) {
		if onProgress != nil {
			onProgress()
		}
	}
	runNode(tb, aguiHTTPScript, progress, &res, scenario, options(tb, opts))
	return res
}

// ok fails the test unless the run ended without a failure or a RUN_ERROR.
func (r aguiRun) ok(tb testing.TB) {
	tb.Helper()
	if r.Failed != nil || len(r.RunErrors) > 0 {
		tb.Fatalf("HttpAgent.runAgent failed %v with RUN_ERRORs %v", deref(r.Failed), r.RunErrors)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// wireEvents returns the events of the wire, without their ids.
func (r aguiRun) wireEvents() []map[string]any {
	out := make([]map[string]any, len(r.Wire))
	for i, w := range r.Wire {
		out[i] = w.Event
	}
	return out
}

// logEnvelopes reads runID's whole log from gw over a resume socket: the events with their
// offsets.
func logEnvelopes(tb testing.TB, ctx context.Context, gw *gateway, runID string) []aguiWire {
	tb.Helper()
	c, _, err := websocket.Dial(ctx, gw.WS+"?runId="+runID+"&offset=-1", nil)
	if err != nil {
		tb.Fatalf("dial resume socket: %v", err)
	}
	defer c.CloseNow()
	envs, err := readEnvelopes(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	return envs
}

// readEnvelopes reads a resume socket's envelopes until it closes 1000.
func readEnvelopes(ctx context.Context, c *websocket.Conn) ([]aguiWire, error) {
	var out []aguiWire
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return out, nil
			}
			return out, fmt.Errorf("resume socket after %d events: %w", len(out), err)
		}
		var env struct {
			ID    string         `json:"id"`
			Chunk map[string]any `json:"chunk"`
		}
		if err := json.Unmarshal(data, &env); err != nil || env.Chunk == nil {
			continue // a ping
		}
		out = append(out, aguiWire{ID: &env.ID, Event: env.Chunk})
	}
}

// sameWire fails the test unless got and want hold the same ids and events, in order.
func sameWire(tb testing.TB, what string, got, want []aguiWire) {
	tb.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		tb.Fatalf("%s differ:\n got %s\nwant %s", what, g, w)
	}
}

// afterMarker returns the log without its first entry, which must be the run.accepted marker.
func afterMarker(tb testing.TB, log []aguiWire) []aguiWire {
	tb.Helper()
	if len(log) == 0 || log[0].Event["type"] != "CUSTOM" || log[0].Event["name"] != "run.accepted" {
		tb.Fatalf("the log does not start with the run.accepted marker: %v", log)
	}
	return log[1:]
}

// distinctIDs fails the test when a wire event has no id or an id seen before.
func distinctIDs(tb testing.TB, wire []aguiWire) {
	tb.Helper()
	seen := map[string]bool{}
	for i, w := range wire {
		if w.ID == nil || *w.ID == "" || seen[*w.ID] {
			tb.Fatalf("wire event %d (%v) has id %v: missing or seen before", i, w.Event, deref(w.ID))
		}
		seen[*w.ID] = true
	}
}

// asMaps converts demoEvents' values for comparison with decoded events.
func asMaps(tb testing.TB, events []any) []map[string]any {
	tb.Helper()
	out := make([]map[string]any, len(events))
	for i, e := range events {
		out[i] = e.(map[string]any)
	}
	return out
}

func tokenReply(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "t%d ", i)
	}
	return b.String()
}

// TestAGUIHttpAgentReply: a plain reply through HttpAgent.runAgent. The response is pure
// AG-UI: the demo agent's events from RUN_STARTED on, each with the id of its offset in the
// run's log, which holds the run.accepted marker first; the client builds the reply message.
func TestAGUIHttpAgentReply(t *testing.T) {
	gw := startGateway(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	spec := turnSpec{RunID: "agui-reply", Text: "hello over AG-UI", ForwardedProps: demoProps(map[string]any{"intervalMs": 5})}
	res := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/agui", "runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps})

	res.ok(t)
	want := asMaps(t, demoEvents(t, spec))
	sameEventList(t, "wire", res.wireEvents(), want)
	sameEventList(t, "onEvent", res.Events, want)
	sameWire(t, "the wire and the log after its marker", res.Wire, afterMarker(t, logEnvelopes(t, ctx, gw, spec.RunID)))
	// The client keeps the reply start's metadata (its createdAt) on the message.
	wantMsgs := []map[string]any{{"id": spec.RunID + ".msg1", "role": "assistant", "content": "You said: " + spec.Text,
		"metadata": want[1]["metadata"]}}
	sameEventList(t, "newMessages", res.NewMessages, wantMsgs)
	if len(res.Requests) != 1 || res.Requests[0].Method != "POST" || res.Requests[0].URL != gw.URL+"/agui" || res.Requests[0].LastEventID != nil {
		t.Errorf("requests = %+v, want one POST %s/agui", res.Requests, gw.URL)
	}
}

// TestAGUIHttpAgentMatchesEncoderServer: a reasoning, tool-call and chunked turn. The demo
// agent's events, chunks included, are streamed once through the gateway (which expands the
// chunks before it stores them) and once by an @ag-ui/encoder server directly (the client
// expands them); the same HttpAgent sees the same events and builds the same newMessages.
func TestAGUIHttpAgentMatchesEncoderServer(t *testing.T) {
	gw := startGateway(t)
	spec := turnSpec{RunID: "agui-rich", Text: "weather?", ForwardedProps: demoProps(map[string]any{"reasoning": true, "toolCall": true, "chunked": true, "intervalMs": 0})}
	raw := demoEvents(t, spec)
	opts := map[string]any{"url": gw.URL + "/agui", "runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps}
	got := runAGUI(t, "run", nil, opts)
	opts["events"] = raw
	ref := runAGUI(t, "reference", nil, opts)

	got.ok(t)
	ref.ok(t)
	sameEventList(t, "newMessages (gateway vs encoder server)", got.NewMessages, ref.NewMessages)
	sameEventList(t, "onEvent (gateway vs encoder server)", got.Events, ref.Events)

	// The comparison covered what it is meant to: chunks to expand, and messages of each kind.
	var rawTypes, wireTypes []string
	for _, e := range asMaps(t, raw) {
		rawTypes = append(rawTypes, e["type"].(string))
	}
	for _, e := range got.wireEvents() {
		wireTypes = append(wireTypes, e["type"].(string))
	}
	if !strings.Contains(strings.Join(rawTypes, " "), "TEXT_MESSAGE_CHUNK") || strings.Contains(strings.Join(wireTypes, " "), "CHUNK") {
		t.Errorf("the agent sent %v and the gateway %v: want chunks from the agent, expanded on the wire", rawTypes, wireTypes)
	}
	roles := map[string]bool{}
	toolCalls := false
	for _, m := range got.NewMessages {
		roles[m["role"].(string)] = true
		if m["toolCalls"] != nil {
			toolCalls = true
		}
	}
	if !roles["reasoning"] || !roles["assistant"] || !toolCalls {
		t.Errorf("newMessages = %v, want a reasoning message and assistant messages with a tool call", got.NewMessages)
	}
}

// TestAGUIHttpAgentJoinedOverSocket: a run started through HttpAgent is joined over the
// WebSocket while it streams, and a run started on the socket is joined by HttpAgent (a GET
// of /agui?runId=&offset=-1). Both sides get the same events at the same offsets, the
// socket's with the marker first, the AG-UI client's from RUN_STARTED.
func TestAGUIHttpAgentJoinedOverSocket(t *testing.T) {
	gw := startGateway(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	t.Run("agui-then-socket", func(t *testing.T) {
		runID := "agui-to-socket"
		joined := make(chan []aguiWire, 1)
		joinErr := make(chan error, 1)
		join := func() {
			go func() {
				c, _, err := websocket.Dial(ctx, gw.WS+"?runId="+runID+"&offset=-1", nil)
				if err != nil {
					joinErr <- err
					return
				}
				defer c.CloseNow()
				envs, err := readEnvelopes(ctx, c)
				joinErr <- err
				joined <- envs
			}()
		}
		res := runAGUI(t, "run", join, map[string]any{"url": gw.URL + "/agui", "runId": runID, "text": "x",
			"forwardedProps": demoProps(map[string]any{"tokens": 30, "intervalMs": 20}), "progressAfter": 3})
		res.ok(t)
		if err := <-joinErr; err != nil {
			t.Fatalf("joining over the socket: %v", err)
		}
		sameWire(t, "the HttpAgent's wire and the socket's join after the marker", res.Wire, afterMarker(t, <-joined))
		if c := res.NewMessages; len(c) != 1 || c[0]["content"] != tokenReply(30) {
			t.Errorf("newMessages = %v, want the reply t1 … t30", c)
		}
	})

	t.Run("socket-then-agui", func(t *testing.T) {
		runID := "socket-to-agui"
		c := dialTurn(t, ctx, gw, runID, `{"tokens":20,"intervalMs":20}`)
		if _, _, err := c.Read(ctx); err != nil { // the marker: the run started
			t.Fatal(err)
		}
		res := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/agui", "runId": runID, "join": true})
		res.ok(t)
		sameWire(t, "the HttpAgent's join and the log after its marker", res.Wire, afterMarker(t, logEnvelopes(t, ctx, gw, runID)))
		if c := res.NewMessages; len(c) != 1 || c[0]["content"] != tokenReply(20) {
			t.Errorf("newMessages = %v, want the reply t1 … t20", c)
		}
		if len(res.Requests) != 1 || res.Requests[0].Method != "GET" {
			t.Errorf("requests = %+v, want one GET", res.Requests)
		}
	})
}

// TestAGUIHttpAgentResumeAfterCut: a loopback proxy cuts HttpAgent's connection mid-turn; its
// fetch repeats the POST with Last-Event-ID (what a front end adds through HttpAgent's fetch
// option) and the client ends with every event of the turn once, in order: the verifier
// would refuse a repeated start, the reducer would double a repeated delta. In the "other
// gateway" case the resuming POST reaches a second gateway process on the same NATS.
func TestAGUIHttpAgentResumeAfterCut(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	for _, elsewhere := range []bool{false, true} {
		name := "same gateway"
		if elsewhere {
			name = "other gateway"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			px := tcpproxy.Start(t, gw.Addr, nil)
			runID := fmt.Sprintf("agui-cut-%v", elsewhere)
			cut := 0
			onProgress := func() {
				if elsewhere {
					px.SetTarget(other.Addr)
				}
				cut = px.Cut()
			}
			res := runAGUI(t, "run", onProgress, map[string]any{"url": "http://" + px.Addr() + "/agui", "runId": runID, "text": "x",
				"forwardedProps": demoProps(map[string]any{"tokens": 40, "intervalMs": 25}), "progressAfter": 5, "resume": true})

			res.ok(t)
			if cut != 1 || px.Accepted() != 2 {
				t.Fatalf("the proxy cut %d connections and accepted %d, want the streaming response cut and one more connection", cut, px.Accepted())
			}
			if len(res.Requests) != 2 || res.Requests[0].LastEventID != nil || res.Requests[1].Method != "POST" ||
				res.Requests[1].LastEventID == nil || *res.Requests[1].LastEventID == "" {
				t.Fatalf("requests = %+v, want a POST, then a POST with Last-Event-ID", res.Requests)
			}
			distinctIDs(t, res.Wire)
			log := afterMarker(t, logEnvelopes(t, ctx, gw, runID))
			sameWire(t, "the events received across the cut and the log after its marker", res.Wire, log)
			logEvents := make([]map[string]any, len(log))
			for i, w := range log {
				logEvents[i] = w.Event
			}
			sameEventList(t, "onEvent", res.Events, logEvents)
			if c := res.NewMessages; len(c) != 1 || c[0]["content"] != tokenReply(40) {
				t.Errorf("newMessages = %v, want the reply t1 … t40 once", c)
			}
		})
	}
}

// TestAGUIHttpAgentRefusedAndAborted: what the client's user sees when the gateway refuses a
// run or it is aborted. A start the gateway refuses is one bare RUN_ERROR, which
// @ag-ui/client's verifier accepts as a first event: runAgent resolves, with no new message,
// and the subscriber's onRunErrorEvent gets the gateway's message and code. A request the
// gateway refuses before any stream (here 401) makes runAgent reject with "HTTP <status>: …".
// DELETE ?runId= aborts the run: the stream ends with RUN_ERROR aborted.
func TestAGUIHttpAgentRefusedAndAborted(t *testing.T) {
	gw := startGateway(t)
	sec := startSecGateway(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	bare := func(t *testing.T, res aguiRun, code string) {
		t.Helper()
		if res.Failed != nil || len(res.Events) != 1 || res.Events[0]["type"] != "RUN_ERROR" || res.Events[0]["code"] != code ||
			len(res.RunErrors) != 1 || res.RunErrors[0]["code"] != code || len(res.NewMessages) != 0 {
			t.Fatalf("failed %s, events %v, onRunErrorEvent %v, newMessages %v: want runAgent resolved with one RUN_ERROR %s",
				deref(res.Failed), res.Events, res.RunErrors, res.NewMessages, code)
		}
		if len(res.Wire) != 1 || res.Wire[0].ID != nil {
			t.Fatalf("wire = %+v, want one bare event (no id: it is not in a log)", res.Wire)
		}
	}

	t.Run("invalid input", func(t *testing.T) {
		res := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/agui", "runId": strings.Repeat("r", 600)})
		bare(t, res, "invalid_input")
	})
	t.Run("another principal's runId", func(t *testing.T) {
		owner := map[string]any{"Authorization": "Bearer " + sec.token(t, "alice", nil)}
		runAGUI(t, "run", nil, map[string]any{"url": sec.URL + "/agui", "runId": "agui-owned", "headers": owner}).ok(t)
		intruder := map[string]any{"Authorization": "Bearer " + sec.token(t, "mallory", nil)}
		res := runAGUI(t, "run", nil, map[string]any{"url": sec.URL + "/agui", "runId": "agui-owned", "headers": intruder})
		bare(t, res, "forbidden")
		if res.RunErrors[0]["message"] != "run belongs to another principal" {
			t.Errorf("RUN_ERROR message %v, want the reason", res.RunErrors[0]["message"])
		}
	})
	t.Run("unauthenticated", func(t *testing.T) {
		res := runAGUI(t, "run", nil, map[string]any{"url": sec.URL + "/agui", "runId": "agui-anonymous"})
		if res.Failed == nil || !strings.HasPrefix(*res.Failed, "HTTP 401: unauthorized") || len(res.Events) != 0 {
			t.Fatalf("failed %s, events %v: want runAgent rejected with HTTP 401", deref(res.Failed), res.Events)
		}
	})
	t.Run("aborted", func(t *testing.T) {
		runID := "agui-aborted"
		res := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/agui", "runId": runID,
			"forwardedProps": demoProps(map[string]any{"tokens": 200, "intervalMs": 20}), "abortAfter": 3})
		if res.DeleteStatus == nil || *res.DeleteStatus != 200 {
			t.Fatalf("DELETE answered %v, want 200", res.DeleteStatus)
		}
		last := res.Events[len(res.Events)-1]
		if res.Failed != nil || len(res.RunErrors) != 1 || res.RunErrors[0]["code"] != "aborted" || last["type"] != "RUN_ERROR" {
			t.Fatalf("failed %s, onRunErrorEvent %v, last event %v: want the run ended by RUN_ERROR aborted", deref(res.Failed), res.RunErrors, last)
		}
		distinctIDs(t, res.Wire)
		sameWire(t, "the aborted run's wire and its log after the marker", res.Wire, afterMarker(t, logEnvelopes(t, ctx, gw, runID)))
	})
}

// TestAGUIPathFlag: --agui-path moves the transport; the old path no longer starts turns.
// Heartbeats (SSE comments) between the events do not disturb HttpAgent.
func TestAGUIPathFlag(t *testing.T) {
	gw := startGateway(t, "--agui-path", "/v1/agui", "--heartbeat", "50ms")
	res := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/v1/agui", "runId": "agui-moved", "text": "moved",
		"forwardedProps": demoProps(map[string]any{"intervalMs": 100})})
	res.ok(t)
	if c := res.NewMessages; len(c) != 1 || c[0]["content"] != "You said: moved" {
		t.Errorf("newMessages = %v, want the reply", c)
	}
	if res.Comments == 0 {
		t.Errorf("no heartbeat on the wire of a turn of about 500ms with --heartbeat 50ms")
	}
	old := runAGUI(t, "run", nil, map[string]any{"url": gw.URL + "/agui", "runId": "agui-old-path"})
	if old.Failed == nil || !strings.HasPrefix(*old.Failed, "HTTP 405") {
		t.Errorf("POST /agui after --agui-path /v1/agui: failed %s, want HTTP 405", deref(old.Failed))
	}
}
