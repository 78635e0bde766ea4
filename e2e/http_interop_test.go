package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// One log, two transports: a turn started over HTTP is resumed on a resume socket, and a turn
// started on a conversation socket is resumed over HTTP with Last-Event-ID, each time on
// another gateway process sharing the first one's NATS. The client ends with every event of the
// turn once, in order.

// httpEvent is one event read from an HTTP stream, with its offset.
type httpEvent struct {
	offset string
	event  map[string]any
}

// readHTTPStream reads events from an SSE or NDJSON response until stop says so or the
// response ends.
func readHTTPStream(tb testing.TB, body io.Reader, ndjson bool, stop func([]httpEvent) bool) []httpEvent {
	tb.Helper()
	var out []httpEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var id string
	for sc.Scan() {
		line := sc.Text()
		var ev httpEvent
		switch {
		case line == "" || strings.HasPrefix(line, ":"):
			continue
		case ndjson:
			var env struct {
				ID    string         `json:"id"`
				Chunk map[string]any `json:"chunk"`
			}
			if err := json.Unmarshal([]byte(line), &env); err != nil || env.ID == "" {
				tb.Fatalf("NDJSON line %q is not an envelope (%v)", line, err)
			}
			ev = httpEvent{env.ID, env.Chunk}
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
			continue
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.event); err != nil || id == "" {
				tb.Fatalf("SSE data %q without an id or not JSON (%v)", line, err)
			}
			ev.offset, id = id, ""
		default:
			tb.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, ev)
		if stop != nil && stop(out) {
			return out
		}
	}
	return out
}

// postStream sends a POST to gw's path and returns the streaming response.
func postStream(tb testing.TB, ctx context.Context, gw *gateway, path, body string, header http.Header) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+path, bytes.NewReader([]byte(body)))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header = header
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", path, err)
	}
	tb.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		tb.Fatalf("POST %s: status %d %s", path, resp.StatusCode, b)
	}
	return resp
}

func contentEvents(n int) func([]httpEvent) bool {
	return func(evs []httpEvent) bool {
		c := 0
		for _, e := range evs {
			if e.event["type"] == "TEXT_MESSAGE_CONTENT" {
				c++
			}
		}
		return c >= n
	}
}

func TestHTTPAndSocketShareTheLog(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	demoOpts := `{"tokens":30,"intervalMs":25}`
	for _, tr := range []struct {
		name, path string
		ndjson     bool
	}{{"sse", "/api/chat", false}, {"ndjson", "/api/chat/ndjson", true}} {
		t.Run(tr.name+"/http-then-socket", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			runID := "run-h2s-" + tr.name
			body := `{"threadId":"t","runId":"` + runID + `","messages":[{"id":"u","role":"user","content":"hi"}],"forwardedProps":{"demo":` + demoOpts + `}}`
			resp := postStream(t, ctx, gw, tr.path, body, http.Header{"X-Run-Id": {runID}})
			head := readHTTPStream(t, resp.Body, tr.ndjson, contentEvents(5))
			resp.Body.Close()
			last := head[len(head)-1].offset

			c, _, err := websocket.Dial(ctx, other.WS+"?runId="+runID+"&offset="+last, nil)
			if err != nil {
				t.Fatalf("dial resume socket: %v", err)
			}
			defer c.CloseNow()
			rest, status := readUntilClose(t, ctx, c)
			if status != websocket.StatusNormalClosure {
				t.Fatalf("resume socket closed %v, want 1000", status)
			}
			got := make([]map[string]any, 0, len(head)+len(rest))
			for _, e := range head {
				got = append(got, e.event)
			}
			got = append(got, rest...)
			if g, w := eventTypes(got), eventTypes(joinLog(t, ctx, gw, runID)); g != w || !strings.HasSuffix(g, "RUN_FINISHED") {
				t.Fatalf("HTTP head + socket rest = %s\nwant the log %s", g, w)
			}
			sameJSON(t, got, joinLog(t, ctx, other, runID))
		})
		t.Run(tr.name+"/socket-then-http", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			runID := "run-s2h-" + tr.name
			c := dialTurn(t, ctx, gw, runID, demoOpts)
			var head []map[string]any
			var last string
			for len(head) < 8 {
				_, data, err := c.Read(ctx)
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				var env struct {
					ID    string         `json:"id"`
					Chunk map[string]any `json:"chunk"`
				}
				if json.Unmarshal(data, &env) == nil && env.Chunk != nil {
					head, last = append(head, env.Chunk), env.ID
				}
			}
			c.CloseNow()
			body := `{"threadId":"t","runId":"` + runID + `","messages":[],"forwardedProps":{}}`
			resp := postStream(t, ctx, other, tr.path, body, http.Header{"X-Run-Id": {runID}, "Last-Event-Id": {last}})
			rest := readHTTPStream(t, resp.Body, tr.ndjson, nil)
			got := head
			for _, e := range rest {
				got = append(got, e.event)
			}
			sameJSON(t, got, joinLog(t, ctx, gw, runID))
			if !strings.HasSuffix(eventTypes(got), "TEXT_MESSAGE_END RUN_FINISHED") {
				t.Fatalf("events = %s", eventTypes(got))
			}
		})
	}
}

// sameJSON fails the test when got and want differ as JSON.
func sameJSON(tb testing.TB, got, want []map[string]any) {
	tb.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		tb.Fatalf("events differ:\n got %s\nwant %s", g, w)
	}
}
