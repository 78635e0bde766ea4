package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// TestReaperEndsEveryLogOnce stops a producing gateway at each step of the end of a turn
// (killed once the terminal reached its client, so after it was stored and, unless the close
// record was quicker, before it; killed after the close record; cut from NATS and killed
// while the terminal is being published) and checks that the log the other gateway's reaper
// leaves ends with exactly one terminal and its close, a sequence that `wsgateway verify` and
// @ag-ui/client accept.
func TestReaperEndsEveryLogOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	host := startGateway(t, "--lease-ttl", "2s", "--takeover", "off") // holds NATS; its reaper ends the logs
	const tokens = 20
	tests := []struct {
		name string
		// stopAt says, for each envelope the client receives, whether to stop the producer
		// now; cut says whether its NATS connection is cut first.
		stopAt   func(e envelope) bool
		cut      bool
		waitLog  bool   // wait for the log's close before the kill
		wantLast string // the log's terminal: its type, or RUN_ERROR:code
	}{
		{"after the terminal is stored", func(e envelope) bool { return e.Type == "RUN_FINISHED" }, false, false, "RUN_FINISHED"},
		{"after the close record", func(e envelope) bool { return e.Type == "RUN_FINISHED" }, false, true, "RUN_FINISHED"},
		{"during the terminal's publish", func(e envelope) bool { return e.Delta == fmt.Sprintf("t%d ", tokens) }, true, false, "RUN_ERROR:producer_lost"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var down atomic.Bool
			px := tcpproxy.Start(t, strings.TrimPrefix(host.NATSURL, "nats://"), func([]byte) bool { return down.Load() })
			p := startGateway(t, "--nats-url", "nats://"+px.Addr(), "--lease-ttl", "2s", "--takeover", "off")
			runID := fmt.Sprintf("stopped-%d", i)
			c := startTurn(t, ctx, p, runID, fmt.Sprintf(`{"tokens":%d,"intervalMs":20}`, tokens))
			f := &follower{runID: runID}
			if err := f.read(ctx, c, func(es []envelope) bool { return tt.stopAt(es[len(es)-1]) }); err != nil {
				t.Fatal(err)
			}
			if tt.cut {
				down.Store(true)
				px.Cut()
			}
			if tt.waitLog {
				readLog(t, ctx, host, runID) // returns once the close record is stored
			}
			p.signal(t, syscall.SIGKILL)
			p.wait(t, 10*time.Second)
			log := readLog(t, ctx, host, runID)
			var types []string
			terminals := 0
			for _, e := range log {
				ty := e.Type
				if ty == "RUN_ERROR" {
					ty += ":" + e.Code
				}
				if e.Type == "RUN_FINISHED" || e.Type == "RUN_ERROR" {
					terminals++
				}
				types = append(types, ty)
			}
			if terminals != 1 || types[len(types)-1] != tt.wantLast {
				t.Fatalf("log = %s, want one terminal, %s, last", strings.Join(types, " "), tt.wantLast)
			}
			events := chunksOf(t, ctx, host, runID)
			verifyLog(t, events)
		})
	}
}

// chunksOf returns the events of runID's log on gw, as NDJSON lines, but the run.accepted
// marker.
func chunksOf(tb testing.TB, ctx context.Context, gw *gateway, runID string) []string {
	tb.Helper()
	c, err := dialWS(ctx, resumeURL(gw, runID, "-1"))
	if err != nil {
		tb.Fatal(err)
	}
	defer c.CloseNow()
	var out []string
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				tb.Fatalf("join %s: %v", runID, err)
			}
			return out
		}
		var f struct {
			Chunk json.RawMessage `json:"chunk"`
		}
		var ev struct {
			Type, Name string
		}
		if json.Unmarshal(data, &f) != nil || f.Chunk == nil || json.Unmarshal(f.Chunk, &ev) != nil {
			continue
		}
		if ev.Type == "CUSTOM" && ev.Name == "run.accepted" {
			continue // the gateway's marker is outside the verified sequence (PROTOCOL.md)
		}
		out = append(out, string(f.Chunk))
	}
}

// verifyLog checks the events with `wsgateway verify` and with @ag-ui/client in Node
// (testdata/npm/agui-reference.mjs).
func verifyLog(tb testing.TB, events []string) {
	tb.Helper()
	cmd := exec.Command(gatewayBin, "verify")
	cmd.Stdin = strings.NewReader(strings.Join(events, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		tb.Errorf("wsgateway verify: %v: %s", err, stderr.Bytes())
	}
	raw := make([]json.RawMessage, len(events))
	for i, e := range events {
		raw[i] = json.RawMessage(e)
	}
	in, _ := json.Marshal(map[string]any{"id": "log", "events": raw})
	node := exec.Command("node", "agui-reference.mjs")
	node.Dir = npmDir(tb)
	node.Stdin = bytes.NewReader(append(in, '\n'))
	node.Stderr = &stderr
	out, err := node.Output()
	if err != nil {
		tb.Fatalf("node agui-reference.mjs: %v: %s", err, stderr.Bytes())
	}
	var res struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil || !res.OK {
		tb.Errorf("@ag-ui/client refuses the log: %s (%v)", out, err)
	}
}
