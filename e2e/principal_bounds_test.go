package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestHostilePrincipalEveryDoor: one principal starts long turns by every door and walks
// away (sockets that send 16 run frames and close, POSTs of /api/chat, /api/chat/ndjson and
// /agui dropped once the stream began, POST /api/threads/{id}/runs), all of one thread and
// side by side (multitaskStrategy concurrent, the worst case), on a gateway with --auth
// jwt and a low --max-principal-turns, while another principal runs ordinary turns. Its turns
// running stay at the bound all along (sampled after each round), the rest are refused and
// counted under the bound's limit, the gateway's goroutines stay bounded, and every turn of
// the other principal completes meanwhile. bench/hostile is the full version, with timings.
func TestHostilePrincipalEveryDoor(t *testing.T) {
	const maxTurns = 4
	key, pemFile := newJWTKey(t)
	gw := startGateway(t, "--auth", "jwt", "--jwt-key-file", pemFile, "--jwt-audience", secAudience, "--jwt-issuer", secIssuer,
		"--max-principal-turns", strconv.Itoa(maxTurns))
	g := &secGateway{gateway: gw, key: key, pemFile: pemFile}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := g.metricValue(t, ctx, "go_goroutines")
	long := `{"tokens":1000,"intervalMs":1000}` // a turn of 1000 s
	tok := g.token(t, "mallory", nil)
	post := func(path string, body []byte, readFirst bool) {
		rctx, rcancel := context.WithCancel(ctx)
		defer rcancel() // walks away
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, g.URL+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		if readFirst && resp.StatusCode == 200 {
			resp.Body.Read(make([]byte, 1))
		}
		resp.Body.Close()
	}
	// The other principal's turns, one after another on its socket, each in a thread of its
	// own, through the flood and after it.
	other := g.dialAs(t, ctx, "trent", "")
	otherDone := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				otherDone <- fmt.Sprintf("%d turns finished", n)
				return
			case <-time.After(200 * time.Millisecond): // a person's pace, under the turn rate
			}
			id := fmt.Sprintf("trent-%d", n)
			frame, _ := json.Marshal(map[string]any{"threadId": id, "runId": id,
				"messages":       []any{map[string]any{"id": "u0", "role": "user", "content": "hi"}},
				"forwardedProps": map[string]any{"demo": map[string]any{"tokens": 3, "intervalMs": 0}}})
			if err := other.Write(ctx, websocket.MessageText, frame); err != nil {
				otherDone <- fmt.Sprintf("run frame %s: %v", id, err)
				return
			}
			for {
				_, data, err := other.Read(ctx)
				if err != nil {
					otherDone <- fmt.Sprintf("turn %s: %v", id, err)
					return
				}
				var w struct {
					Type  string `json:"type"`
					Chunk struct{ Type, Code, Message string }
				}
				json.Unmarshal(data, &w)
				if w.Type == "RUN_ERROR" || w.Chunk.Type == "RUN_ERROR" {
					otherDone <- fmt.Sprintf("turn %s: %s", id, data)
					return
				}
				if w.Chunk.Type == "RUN_FINISHED" {
					break
				}
			}
			n++
		}
	}()
	var running, goroutines float64
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		c := g.dialAs(t, ctx, "mallory", "")
		for j := 0; j < 16; j++ {
			c.Write(ctx, websocket.MessageText, concurrent(runFrameJSON(t, fmt.Sprintf("ws-%d-%d", i, j), long, "hi")))
		}
		c.CloseNow()
		post("/api/chat", concurrent(runFrameJSON(t, fmt.Sprintf("sse-%d", i), long, "hi")), true)
		post("/api/chat/ndjson", concurrent(runFrameJSON(t, fmt.Sprintf("ndjson-%d", i), long, "hi")), true)
		post("/agui", concurrent(runFrameJSON(t, fmt.Sprintf("agui-%d", i), long, "hi")), true)
		post("/api/threads/t/runs", concurrent(runFrameJSON(t, fmt.Sprintf("thread-%d", i), long, "hi")), false)
		running = max(running, g.metricValue(t, ctx, "wsgateway_turn_started_total")-g.metricValue(t, ctx, "wsgateway_turn_ended_total"))
		goroutines = max(goroutines, g.metricValue(t, ctx, "go_goroutines"))
	}
	close(stop)
	otherGot := <-otherDone
	refused := g.metricValue(t, ctx, `wsgateway_conversation_limit_refusals_total{limit="max_principal_turns"}`)
	t.Logf("turns running at most %v, max-principal-turns refusals %v, goroutines at most %v (%v before); the other principal: %s",
		running, refused, goroutines, base, otherGot)
	// The other principal runs one turn at a time.
	if running > maxTurns+1 {
		t.Errorf("%v turns running, want at most --max-principal-turns %d and the other principal's one", running, maxTurns)
	}
	if refused == 0 {
		t.Error("no start refused for max-principal-turns")
	}
	// Each running turn costs a few goroutines (agent, log writer, lease); hundreds would
	// mean turns or requests left behind.
	if goroutines > base+30*maxTurns {
		t.Errorf("%v goroutines, %v before the flood", goroutines, base)
	}
	if !strings.HasSuffix(otherGot, "turns finished") || otherGot == "0 turns finished" {
		t.Errorf("another principal's turns meanwhile: %s", otherGot)
	}
}
