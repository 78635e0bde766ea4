package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// The four HTTP connection adapters of @tanstack/ai-client (fetchServerSentEvents,
// xhrServerSentEvents, fetchHttpStream, xhrHttpStream) against a real gateway process: these
// tests run testdata/npm/tanstack-http.mjs and compare what the adapters yielded with the events
// the demo agent produces for the same run frame.

const tanstackHTTPScript = "tanstack-http.mjs"

// httpAdapters are the adapter names of the script, with the path each one talks to.
var httpAdapters = []struct{ name, path string }{
	{"fetch-sse", "/api/chat"},
	{"xhr-sse", "/api/chat"},
	{"fetch-ndjson", "/api/chat/ndjson"},
	{"xhr-ndjson", "/api/chat/ndjson"},
}

// httpRequest is one HTTP request an adapter made.
type httpRequest struct {
	Method      string  `json:"method"`
	URL         string  `json:"url"`
	LastEventID *string `json:"lastEventId"`
}

func TestHTTPAdaptersChatClientTurn(t *testing.T) {
	gw := startGateway(t)
	for _, a := range httpAdapters {
		t.Run(a.name, func(t *testing.T) {
			var res struct {
				Messages []struct {
					Role  string `json:"role"`
					Parts []struct {
						Type    string `json:"type"`
						Content string `json:"content"`
					} `json:"parts"`
				} `json:"messages"`
				Chunks   []any         `json:"chunks"`
				Error    *string       `json:"error"`
				Requests []httpRequest `json:"requests"`
			}
			text := "hello over " + a.name
			runNode(t, tanstackHTTPScript, nil, &res, "chat", a.name, gw.URL, options(t, map[string]any{"text": text}))

			if res.Error != nil {
				t.Errorf("ChatClient error: %s", *res.Error)
			}
			if len(res.Messages) != 2 || res.Messages[1].Role != "assistant" {
				t.Fatalf("ChatClient messages = %+v, want a user message and an assistant reply", res.Messages)
			}
			var reply string
			for _, p := range res.Messages[1].Parts {
				if p.Type == "text" {
					reply += p.Content
				}
			}
			if want := "You said: " + text; reply != want || replyText(res.Chunks) != want {
				t.Errorf("assistant reply = %q, chunks' text = %q, want %q", reply, replyText(res.Chunks), want)
			}
			if first, _ := res.Chunks[0].(map[string]any); len(res.Chunks) == 0 || first["name"] != "run.accepted" {
				t.Errorf("first chunk = %v, want the run.accepted marker", res.Chunks[0])
			}
			if len(res.Requests) != 1 || res.Requests[0].Method != "POST" || res.Requests[0].URL != gw.URL+a.path {
				t.Errorf("requests = %+v, want one POST %s", res.Requests, gw.URL+a.path)
			}
		})
	}
}

// TestHTTPAdaptersResumeAfterCut cuts the adapter's connection mid-turn (a loopback proxy resets
// it); the adapter repeats the POST with Last-Event-ID by itself and must end with every event of
// the turn exactly once, in order, while the agent ran once. In the "other gateway" cases the
// proxy sends the resuming POST to a second gateway process sharing the first one's NATS, as a
// load balancer may.
func TestHTTPAdaptersResumeAfterCut(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	for _, a := range httpAdapters {
		for _, elsewhere := range []bool{false, true} {
			name := a.name + "/same gateway"
			if elsewhere {
				name = a.name + "/other gateway"
			}
			t.Run(name, func(t *testing.T) { resumeAfterCut(t, gw, other, a.name, elsewhere) })
		}
	}
}

func resumeAfterCut(t *testing.T, gw, other *gateway, adapter string, elsewhere bool) {
	px := tcpproxy.Start(t, gw.Addr, nil)
	spec := turnSpec{RunID: fmt.Sprintf("run-cut-%s-%v", adapter, elsewhere), Text: "x", ForwardedProps: demoProps(map[string]any{"tokens": 40, "intervalMs": 25})}
	cut := 0
	onProgress := func(p json.RawMessage) {
		if string(p) == `"cut"` {
			if elsewhere {
				px.SetTarget(other.Addr)
			}
			cut = px.Cut()
		}
	}
	var res struct {
		Chunks   []any         `json:"chunks"`
		Requests []httpRequest `json:"requests"`
	}
	runNode(t, tanstackHTTPScript, onProgress, &res, "resume", adapter, "http://"+px.Addr(),
		options(t, map[string]any{"runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps, "cutAfter": 5}))

	if cut != 1 || px.Accepted() != 2 {
		t.Fatalf("the proxy cut %d connections and accepted %d, want the streaming response cut and one more connection", cut, px.Accepted())
	}
	want := expectedEvents(t, spec)
	sameEvents(t, "events received across the cut", res.Chunks, want)
	if len(res.Requests) != 2 {
		t.Fatalf("requests = %+v, want the POST and one resuming POST", res.Requests)
	}
	if r := res.Requests[0]; r.Method != "POST" || r.LastEventID != nil {
		t.Errorf("first request = %+v, want a POST without Last-Event-ID", r)
	}
	if r := res.Requests[1]; r.Method != "POST" || r.LastEventID == nil || *r.LastEventID == "" {
		t.Errorf("second request = %+v, want a POST with Last-Event-ID", r)
	}
	// The log holds the turn once: the resume did not start the agent again.
	log := joinLog(t, t.Context(), gw, spec.RunID)
	got := make([]any, len(log))
	for i, ev := range log {
		got[i] = asTanstackChunk(map[string]any(ev))
	}
	sameEvents(t, "the run's log", got, want)
}

func TestHTTPAdaptersJoinRun(t *testing.T) {
	gw := startGateway(t)
	for _, a := range httpAdapters {
		t.Run(a.name, func(t *testing.T) {
			spec := turnSpec{RunID: "run-join-" + a.name, Text: "join me", ForwardedProps: demoProps(map[string]any{"tokens": 30, "intervalMs": 25})}
			var res struct {
				Chunks         []any         `json:"chunks"`
				JoinedRunning  []any         `json:"joinedRunning"`
				JoinedFinished []any         `json:"joinedFinished"`
				Requests       []httpRequest `json:"requests"`
			}
			runNode(t, tanstackHTTPScript, nil, &res, "join", a.name, gw.URL,
				options(t, map[string]any{"runId": spec.RunID, "text": spec.Text, "forwardedProps": spec.ForwardedProps, "joinAfter": 3}))

			want := expectedEvents(t, spec)
			sameEvents(t, "the turn's client", res.Chunks, want)
			sameEvents(t, "joinRun while the turn runs", res.JoinedRunning, want)
			sameEvents(t, "joinRun after the turn finished", res.JoinedFinished, want)
			joinURL := fmt.Sprintf("%s%s?%s", gw.URL, a.path, url.Values{"offset": {"-1"}, "runId": {spec.RunID}}.Encode())
			if len(res.Requests) != 3 || res.Requests[1].Method != "GET" || res.Requests[1].URL != joinURL || res.Requests[2].URL != joinURL {
				t.Errorf("requests = %+v, want the POST and two GET %s", res.Requests, joinURL)
			}
		})
	}
}
