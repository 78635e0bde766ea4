package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/internal/tcpproxy"
	"github.com/wsgateway/wsgateway/protocol"
)

// The @tanstack/ai-client webSocket() adapter against a real gateway process: these tests run
// testdata/npm/tanstack-ws.mjs and compare what the client received with the events the demo
// agent produces for the same run frame.

const tanstackScript = "tanstack-ws.mjs"

// runAccepted is the gateway's marker, the first event of every turn.
var runAccepted = map[string]any{"type": "CUSTOM", "name": "run.accepted", "value": map[string]any{}}

// turnSpec is one run frame as the script builds it: the adapter sends
// {threadId, runId, messages: [{id: "user-1", role: "user", content: text}], forwardedProps, …}.
type turnSpec struct {
	ThreadID       string         `json:"threadId,omitempty"`
	RunID          string         `json:"runId"`
	Text           string         `json:"text"`
	ForwardedProps map[string]any `json:"forwardedProps,omitempty"`
}

func demoProps(opts map[string]any) map[string]any { return map[string]any{"demo": opts} }

// expectedEvents returns what the client must yield for spec: the run.accepted marker, then
// the demo agent's events for the same frame, in order, as the client restores them.
func expectedEvents(tb testing.TB, spec turnSpec) []any {
	tb.Helper()
	events := []any{runAccepted}
	for _, ev := range demoEvents(tb, spec) {
		events = append(events, asTanstackChunk(ev))
	}
	return events
}

// demoEvents returns the events the demo agent emits for spec's run frame (as the scripts
// build it), before the gateway's pipeline: chunks are not expanded.
func demoEvents(tb testing.TB, spec turnSpec) []any {
	tb.Helper()
	threadID := spec.ThreadID
	if threadID == "" {
		threadID = "thread-1"
	}
	props := map[string]any{}
	if d, ok := spec.ForwardedProps["demo"].(map[string]any); ok {
		fast := map[string]any{}
		for k, v := range d {
			fast[k] = v
		}
		fast["intervalMs"] = 0 // the pauses do not change the events
		props["demo"] = fast
	}
	frame, err := json.Marshal(map[string]any{
		"threadId":       threadID,
		"runId":          spec.RunID,
		"messages":       []any{map[string]any{"id": "user-1", "role": "user", "content": spec.Text}},
		"forwardedProps": props,
	})
	if err != nil {
		tb.Fatal(err)
	}
	in, err := protocol.DecodeRunAgentInput(frame)
	if err != nil {
		tb.Fatalf("DecodeRunAgentInput(%s): %v", frame, err)
	}
	var events []any
	emit := func(ev []byte) error {
		var v any
		if err := json.Unmarshal(ev, &v); err != nil {
			return err
		}
		events = append(events, v)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := demo.New().Run(ctx, in, emit); err != nil {
		tb.Fatalf("demo agent for %s: %v", frame, err)
	}
	return events
}

// asTanstackChunk applies the restoration @tanstack/ai-client makes to every inbound chunk
// (restoreInboundChunk): a TOOL_CALL_START gains toolName, its in-process alias of toolCallName.
func asTanstackChunk(ev any) any {
	m, ok := ev.(map[string]any)
	if ok && m["type"] == "TOOL_CALL_START" && m["toolName"] == nil && m["toolCallName"] != nil {
		m["toolName"] = m["toolCallName"]
	}
	// The client copies metadata.tanstack's fields to the top level (restoreInboundChunk).
	md, _ := m["metadata"].(map[string]any)
	ts, _ := md["tanstack"].(map[string]any)
	for k, v := range ts {
		if _, set := m[k]; !set {
			m[k] = v
		}
	}
	return ev
}

// sameEvents fails the test when got differs from want, showing both sequences. A reply
// start's createdAt (the demo agent's clock at its emit) compares equal to any other valid
// one.
func sameEvents(tb testing.TB, what string, got, want []any) {
	tb.Helper()
	got, want = maskCreatedAt(got), maskCreatedAt(want)
	if reflect.DeepEqual(got, want) {
		return
	}
	tb.Errorf("%s: got %d events, want %d\n got: %s\nwant: %s", what, len(got), len(want), lines(got), lines(want))
}

// maskCreatedAt returns a copy of events where each metadata.tanstack.createdAt that is an
// ISO 8601 time, and the client's top-level copy of it, read "<createdAt>".
func maskCreatedAt(events []any) []any {
	out := make([]any, len(events))
	for i, ev := range events {
		out[i] = ev
		m, _ := ev.(map[string]any)
		md, _ := m["metadata"].(map[string]any)
		ts, _ := md["tanstack"].(map[string]any)
		at, _ := ts["createdAt"].(string)
		if _, err := time.Parse(time.RFC3339, at); err != nil {
			continue
		}
		c := maps.Clone(m)
		c["metadata"] = maps.Clone(md)
		c["metadata"].(map[string]any)["tanstack"] = map[string]any{"createdAt": "<createdAt>"}
		if c["createdAt"] == at { // the client's copy (asTanstackChunk)
			c["createdAt"] = "<createdAt>"
		}
		out[i] = c
	}
	return out
}

func lines(events []any) string {
	var b strings.Builder
	for _, ev := range events {
		j, _ := json.Marshal(ev)
		b.WriteString("\n  ")
		b.Write(j)
	}
	return b.String()
}

// replyText concatenates the deltas of the TEXT_MESSAGE_CONTENT events.
func replyText(events []any) string {
	var b strings.Builder
	for _, ev := range events {
		if m, ok := ev.(map[string]any); ok && m["type"] == "TEXT_MESSAGE_CONTENT" {
			d, _ := m["delta"].(string)
			b.WriteString(d)
		}
	}
	return b.String()
}

func options(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

func TestTanstackChatClientTurn(t *testing.T) {
	gw := startGateway(t)
	var res struct {
		Messages []struct {
			Role  string `json:"role"`
			Parts []struct {
				Type    string `json:"type"`
				Content string `json:"content"`
			} `json:"parts"`
		} `json:"messages"`
		Chunks []any    `json:"chunks"`
		Error  *string  `json:"error"`
		Opened []string `json:"opened"`
	}
	runNode(t, tanstackScript, nil, &res, "chat", gw.WS, options(t, map[string]any{"text": "hello from tanstack"}))

	if res.Error != nil {
		t.Errorf("ChatClient error: %s", *res.Error)
	}
	if len(res.Messages) != 2 || res.Messages[0].Role != "user" || res.Messages[1].Role != "assistant" {
		t.Fatalf("ChatClient messages = %+v, want a user message and an assistant reply", res.Messages)
	}
	var text strings.Builder
	for _, p := range res.Messages[1].Parts {
		if p.Type == "text" {
			text.WriteString(p.Content)
		}
	}
	if got, want := text.String(), "You said: hello from tanstack"; got != want {
		t.Errorf("assistant reply = %q, want %q", got, want)
	}
	if got, want := replyText(res.Chunks), "You said: hello from tanstack"; got != want {
		t.Errorf("text of the chunks = %q, want %q", got, want)
	}
	if len(res.Opened) != 1 {
		t.Errorf("client opened %d sockets (%q), want 1", len(res.Opened), res.Opened)
	}
}

func TestTanstackTwoTurnsOneSocket(t *testing.T) {
	gw := startGateway(t)
	turns := []turnSpec{
		{RunID: "run-first", Text: "first turn"},
		{RunID: "run-second", Text: "second", ForwardedProps: demoProps(map[string]any{"tokens": 3, "intervalMs": 5, "reasoning": true, "toolCall": true})},
	}
	var res struct {
		Turns  [][]any  `json:"turns"`
		Opened []string `json:"opened"`
	}
	runNode(t, tanstackScript, nil, &res, "turns", gw.WS, options(t, map[string]any{"turns": turns}))

	if len(res.Turns) != len(turns) {
		t.Fatalf("got %d turns, want %d", len(res.Turns), len(turns))
	}
	for i, spec := range turns {
		sameEvents(t, "turn "+spec.RunID, res.Turns[i], expectedEvents(t, spec))
	}
	if got, want := replyText(res.Turns[0]), "You said: first turn"; got != want {
		t.Errorf("first reply = %q, want %q", got, want)
	}
	if got, want := replyText(res.Turns[1]), "t1 t2 t3 "; got != want {
		t.Errorf("second reply = %q, want %q", got, want)
	}
	if len(res.Opened) != 1 {
		t.Errorf("client opened %d sockets (%q), want one conversation socket for both turns", len(res.Opened), res.Opened)
	}
}

// TestTanstackResumesAfterDrop cuts the client's connection mid-turn (a loopback proxy resets
// it); the client reconnects by itself with ?runId=&offset= and must end with every event of
// the turn exactly once, in order. In the second case the proxy sends the reconnect to another
// gateway process sharing the first one's NATS, as a load balancer may.
func TestTanstackResumesAfterDrop(t *testing.T) {
	for _, c := range []struct {
		name string
		// otherGateway: the client reconnects to another gateway; killed: the gateway
		// running the turn is killed (kill -9) at the drop, and the other takes it over.
		otherGateway, killed bool
	}{{"same gateway", false, false}, {"other gateway", true, false}, {"gateway killed", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			var gw, other *gateway
			if c.killed {
				other = startGateway(t, "--lease-ttl", "2s") // holds NATS, takes the turn over
				gw = startGateway(t, "--nats-url", other.NATSURL, "--lease-ttl", "2s")
			} else {
				gw = startGateway(t)
				if c.otherGateway {
					other = startGateway(t, "--nats-url", gw.NATSURL)
				}
			}
			px := tcpproxy.Start(t, gw.Addr, nil)
			spec := turnSpec{RunID: "run-drop", Text: "x", ForwardedProps: demoProps(map[string]any{"tokens": 60, "intervalMs": 25})}
			cut := 0
			var res struct {
				Chunks []any    `json:"chunks"`
				Opened []string `json:"opened"`
			}
			onProgress := func(p json.RawMessage) {
				if string(p) != `"cut"` {
					return
				}
				if other != nil {
					px.SetTarget(other.Addr)
				}
				cut = px.Cut()
				if c.killed {
					gw.signal(t, syscall.SIGKILL)
				}
			}
			runNode(t, tanstackScript, onProgress, &res, "resume", "ws://"+px.Addr()+"/ws",
				options(t, map[string]any{"runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps, "cutAfter": 5}))

			if cut != 1 {
				t.Fatalf("the proxy cut %d connections, want the conversation socket", cut)
			}
			// Exactly the events of the turn, each once, in order, across the drop.
			sameEvents(t, "events received across the drop", res.Chunks, expectedEvents(t, spec))
			if len(res.Opened) != 2 {
				t.Fatalf("client opened %q, want the conversation socket and one resume socket", res.Opened)
			}
			u, err := url.Parse(res.Opened[1])
			if err != nil {
				t.Fatal(err)
			}
			if q := u.Query(); q.Get("runId") != spec.RunID || q.Get("offset") == "" {
				t.Errorf("resume URL %q, want runId=%s and the last offset", res.Opened[1], spec.RunID)
			}
			if px.Accepted() != 2 {
				t.Errorf("the proxy accepted %d connections, want 2", px.Accepted())
			}
			if other != nil {
				// The resume was served by the other process.
				_, body, err := httpGet(context.Background(), other.URL+"/metrics")
				if want := `wsgateway_conversation_resumes_total{result="completed",transport="websocket"} 1`; err != nil || !strings.Contains(body, want) {
					t.Errorf("metrics of the other gateway lack %q (%v)", want, err)
				}
			}
		})
	}
}

func TestTanstackJoinRun(t *testing.T) {
	gw := startGateway(t)
	spec := turnSpec{RunID: "run-join", Text: "join me", ForwardedProps: demoProps(map[string]any{"tokens": 40, "intervalMs": 25})}
	var res struct {
		Chunks         []any `json:"chunks"`
		JoinedRunning  []any `json:"joinedRunning"`
		JoinedFinished []any `json:"joinedFinished"`
	}
	runNode(t, tanstackScript, nil, &res, "join", gw.WS,
		options(t, map[string]any{"runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps, "joinAfter": 3}))

	want := expectedEvents(t, spec)
	sameEvents(t, "conversation client", res.Chunks, want)
	sameEvents(t, "joinRun while the turn runs", res.JoinedRunning, want)
	sameEvents(t, "joinRun after the turn finished", res.JoinedFinished, want)
}

func TestTanstackAbort(t *testing.T) {
	gw := startGateway(t)
	spec := turnSpec{RunID: "run-abort", Text: "stop me", ForwardedProps: demoProps(map[string]any{"tokens": 200, "intervalMs": 20})}
	var res struct {
		Chunks []any `json:"chunks"`
		Log    []any `json:"log"`
	}
	runNode(t, tanstackScript, nil, &res, "abort", gw.WS,
		options(t, map[string]any{"runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps, "abortAfter": 3}))

	full := expectedEvents(t, spec)
	if len(res.Log) < 2 {
		t.Fatalf("log of the aborted run has %d events: %s", len(res.Log), lines(res.Log))
	}
	last := res.Log[len(res.Log)-1]
	wantLast := map[string]any{"type": "RUN_ERROR", "message": "Request aborted", "code": "aborted"}
	if !reflect.DeepEqual(last, wantLast) {
		t.Errorf("last event of the aborted run = %s, want %s", lines([]any{last}), lines([]any{wantLast}))
	}
	produced := res.Log[:len(res.Log)-1]
	if len(produced) >= len(full) {
		t.Fatalf("the aborted run logged all %d events of the turn: the abort did not stop the agent", len(full))
	}
	sameEvents(t, "log before the abort", produced, full[:len(produced)])
	if len(res.Chunks) > len(res.Log) || !reflect.DeepEqual(res.Chunks, res.Log[:len(res.Chunks)]) {
		t.Errorf("events received live are not a prefix of the log:\nlive: %s\n log: %s", lines(res.Chunks), lines(res.Log))
	}
}

func TestInvalidRunFrames(t *testing.T) {
	gw := startGateway(t)
	frames := []string{
		`not json at all`, // dropped: no answer, the socket stays open
		`{"threadId":"t","messages":[]}`,
		`{"threadId":"t","runId":"r1","messages":"hello"}`,
		`{"threadId":"t","runId":"r2","messages":[{"id":"m","role":"robot","content":"x"}]}`,
		`{"threadId":"t","runId":"","messages":[]}`,
	}
	var res struct {
		Frames []map[string]any `json:"frames"`
	}
	runNode(t, tanstackScript, nil, &res, "raw", gw.WS, options(t, map[string]any{"frames": frames, "expect": len(frames) - 1}))

	for i, f := range res.Frames {
		msg, _ := f["message"].(string)
		if f["type"] != "RUN_ERROR" || f["code"] != "invalid_input" || msg == "" || f["chunk"] != nil {
			t.Errorf("answer %d to %s = %v, want a bare RUN_ERROR with code invalid_input and a message", i, frames[i+1], f)
		}
	}
	if len(res.Frames) != len(frames)-1 {
		t.Errorf("got %d answers, want %d", len(res.Frames), len(frames)-1)
	}
}
