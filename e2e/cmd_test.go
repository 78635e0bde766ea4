package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/web"
)

// The command line and the process: endpoints, usage errors, graceful shutdown.

// TestRefusedPortWarned starts the gateway on a port browsers and fetch refuse: it serves, and
// its log warns that the page and the npm clients cannot reach it there. A gateway on port 0
// (the harness's) does not warn.
func TestRefusedPortWarned(t *testing.T) {
	port := 0
	for p := 1024; p < 1<<16 && port == 0; p++ {
		if !web.RefusedPort(p) {
			continue
		}
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			ln.Close()
			port = p
		}
	}
	if port == 0 {
		t.Fatal("every port from 1024 up that browsers refuse is taken on this machine")
	}
	refused := startGateway(t, "--addr", fmt.Sprintf("127.0.0.1:%d", port))
	good := startGateway(t)
	const warning = `"level":"WARN","msg":"browsers and fetch refuse this port`
	if !strings.Contains(refused.log(), warning) {
		t.Errorf("gateway on port %d: no warning %q in its log:\n%s", port, warning, refused.log())
	}
	if strings.Contains(good.log(), warning) {
		t.Errorf("gateway on %s warns of a refused port:\n%s", good.Addr, good.log())
	}
}

func TestEndpoints(t *testing.T) {
	gw := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		path   string
		status int
		want   []string // in the body
	}{
		{"/healthz", 200, []string{"ok"}},
		{"/readyz", 200, []string{"ready"}},
		{"/metrics", 200, []string{
			"wsgateway_conversation_open_sockets",
			"wsgateway_turn_started_total",
			"go_goroutines",
			"process_resident_memory_bytes",
		}},
		{"/", 200, []string{"<html"}},
	}
	for _, tt := range tests {
		status, body, err := httpGet(ctx, gw.URL+tt.path)
		if err != nil || status != tt.status {
			t.Errorf("GET %s = %d, %v; want %d", tt.path, status, err, tt.status)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: body lacks %q", tt.path, w)
			}
		}
	}
}

func TestStartLogLine(t *testing.T) {
	gw := startGateway(t)
	recs := gw.logRecords("listening")
	if len(recs) != 1 {
		t.Fatalf("%d start lines, want 1", len(recs))
	}
	for key, want := range map[string]string{"addr": gw.Addr, "nats": "embedded", "agent": "demo"} {
		if recs[0][key] != want {
			t.Errorf("start line %s = %v, want %q", key, recs[0][key], want)
		}
	}
	if auth, _ := recs[0]["auth"].(string); !strings.Contains(auth, "off") {
		t.Errorf("start line auth = %q, want it to say authentication is off", auth)
	}
}

func TestCommandLine(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the gateway: %v", buildErr)
	}
	tests := []struct {
		args       []string
		env        []string
		code       int
		wantStdout string
		wantStderr string
	}{
		{[]string{"--help"}, nil, 0, "WSGATEWAY_IDLE_TIMEOUT", ""},
		{[]string{"serve", "-h"}, nil, 0, "--drain-timeout (default 10s; env WSGATEWAY_DRAIN_TIMEOUT)", ""},
		{[]string{"version"}, nil, 0, "wsgateway dev", ""},
		{[]string{"--idle-timeout", "soon"}, nil, 2, "", "want a duration such as 30s, 5m or 1h"},
		{[]string{"--agent", "openai"}, nil, 2, "", "--agent openai needs --agent-url"},
		{[]string{"--agent", "llama"}, nil, 2, "", `unknown agent "llama"`},
		{[]string{"--replicas", "0"}, nil, 2, "", "want an integer from 1 to 5"},
		{nil, []string{"WSGATEWAY_HEARTBEAT=-1s"}, 2, "", `WSGATEWAY_HEARTBEAT="-1s": must be positive`},
		{[]string{"frobnicate"}, nil, 2, "", `unknown command "frobnicate"`},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, gatewayBin, tt.args...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, tt.env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("wsgateway %q: %v", tt.args, err)
		}
		if code != tt.code || !strings.Contains(stdout.String(), tt.wantStdout) || !strings.Contains(stderr.String(), tt.wantStderr) {
			t.Errorf("wsgateway %q (env %q) exited %d\nstdout: %s\nstderr: %s\nwant exit %d, stdout with %q, stderr with %q",
				tt.args, tt.env, code, stdout.String(), stderr.String(), tt.code, tt.wantStdout, tt.wantStderr)
		}
	}
}

// dialTurn opens a conversation socket and sends one run frame for the demo agent.
func dialTurn(tb testing.TB, ctx context.Context, gw *gateway, runID, demoOpts string) *websocket.Conn {
	tb.Helper()
	return dialThreadTurn(tb, ctx, gw, "t", runID, demoOpts)
}

// readUntilClose reads envelopes from c until it closes and returns their events and the close
// status.
func readUntilClose(tb testing.TB, ctx context.Context, c *websocket.Conn) ([]map[string]any, websocket.StatusCode) {
	tb.Helper()
	var events []map[string]any
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			status := websocket.CloseStatus(err)
			if status == -1 {
				tb.Fatalf("read: %v (after %d events)", err, len(events))
			}
			return events, status
		}
		var env struct {
			ID    string         `json:"id"`
			Chunk map[string]any `json:"chunk"`
		}
		if err := json.Unmarshal(data, &env); err != nil || env.Chunk == nil {
			continue // a ping, or a bare event
		}
		events = append(events, env.Chunk)
	}
}

// joinLog reads a run's whole log (offset -1) from gw.
func joinLog(tb testing.TB, ctx context.Context, gw *gateway, runID string) []map[string]any {
	tb.Helper()
	c, _, err := websocket.Dial(ctx, gw.WS+"?runId="+runID+"&offset=-1", nil)
	if err != nil {
		tb.Fatalf("dial resume socket: %v", err)
	}
	defer c.CloseNow()
	events, status := readUntilClose(tb, ctx, c)
	if status != websocket.StatusNormalClosure {
		tb.Fatalf("joining %s closed %v after %d events, want 1000", runID, status, len(events))
	}
	return events
}

func eventTypes(events []map[string]any) string {
	var out []string
	for _, e := range events {
		t, _ := e["type"].(string)
		out = append(out, t)
	}
	return strings.Join(out, " ")
}

// TestGracefulShutdown sends SIGTERM while turns of two threads run: sockets close 1012, a
// turn that ends within the drain timeout finishes into its log, one that does not is ended
// with RUN_ERROR code shutdown, and the process exits 0. A gateway restarted on the same data
// directory then serves both complete logs.
func TestGracefulShutdown(t *testing.T) {
	dataDir := t.TempDir()
	gw := startGateway(t, "--data-dir", dataDir, "--drain-timeout", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Each in a thread of its own: a second turn of one thread would wait for the first.
	short := dialThreadTurn(t, ctx, gw, "t-short", "run-short", `{"tokens":30,"intervalMs":20}`) // ~0.6 s
	long := dialThreadTurn(t, ctx, gw, "t-long", "run-long", `{"tokens":1000,"intervalMs":20}`)  // ~20 s
	for _, c := range []*websocket.Conn{short, long} {
		if _, _, err := c.Read(ctx); err != nil { // run.accepted: the turn is running
			t.Fatal(err)
		}
	}
	gw.signal(t, syscall.SIGTERM)
	for name, c := range map[string]*websocket.Conn{"run-short": short, "run-long": long} {
		if _, status := readUntilClose(t, ctx, c); status != websocket.StatusServiceRestart {
			t.Errorf("%s socket closed %v on SIGTERM, want 1012", name, status)
		}
	}
	if err := gw.wait(t, 15*time.Second); err != nil {
		t.Fatalf("gateway exited with %v after SIGTERM, want 0", err)
	}

	again := startGateway(t, "--data-dir", dataDir)
	shortLog := joinLog(t, ctx, again, "run-short")
	if got := eventTypes(shortLog); !strings.HasSuffix(got, "TEXT_MESSAGE_END RUN_FINISHED") || strings.Count(got, "TEXT_MESSAGE_CONTENT") != 30 {
		t.Errorf("log of the turn that fit in the drain timeout: %s, want all 30 deltas and RUN_FINISHED", got)
	}
	longLog := joinLog(t, ctx, again, "run-long")
	last := longLog[len(longLog)-1]
	if last["type"] != "RUN_ERROR" || last["code"] != "shutdown" {
		t.Errorf("last event of the turn cut by the drain timeout = %v, want RUN_ERROR code shutdown", last)
	}
	if n := strings.Count(eventTypes(longLog), "TEXT_MESSAGE_CONTENT"); n == 0 || n >= 1000 {
		t.Errorf("turn cut by the drain timeout logged %d deltas, want some and not all", n)
	}
}

// TestSecondSignalExitsAtOnce: with a long drain timeout and a running turn, a second SIGTERM
// ends the process without waiting for the drain.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	gw := startGateway(t, "--drain-timeout", "60s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dialTurn(t, ctx, gw, "run-slow", `{"tokens":1000,"intervalMs":20}`)
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	gw.signal(t, syscall.SIGTERM)
	readUntilClose(t, ctx, c) // the first signal closed the sockets: shutdown has begun
	start := time.Now()
	gw.signal(t, syscall.SIGTERM)
	err := gw.wait(t, 10*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("after a second SIGTERM the gateway exited with %v, want exit status 1", err)
	}
	t.Logf("exited %v after the second signal", time.Since(start))
}

// TestReadyzFollowsNATS: a gateway on an external NATS answers /readyz 200 while NATS is up,
// and 503 once it is gone, while /healthz stays 200. The 503 says "not ready" and nothing of the
// store's error, which names hosts and streams: that goes to the gateway's log.
func TestReadyzFollowsNATS(t *testing.T) {
	nats := startGateway(t) // its embedded server is the NATS of the second gateway
	gw := startGateway(t, "--nats-url", nats.NATSURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if status, _, err := httpGet(ctx, gw.URL+"/readyz"); err != nil || status != 200 {
		t.Fatalf("GET /readyz with NATS up = %d, %v; want 200", status, err)
	}
	nats.signal(t, syscall.SIGTERM)
	if err := nats.wait(t, 15*time.Second); err != nil {
		t.Fatalf("first gateway exited with %v", err)
	}
	for {
		status, body, err := httpGet(ctx, gw.URL+"/readyz")
		if err == nil && status == 503 {
			if body != "not ready\n" {
				t.Errorf("GET /readyz with NATS down: body %q, want only %q", body, "not ready\n")
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET /readyz never answered 503 after NATS stopped (last %d, %v)", status, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if status, _, err := httpGet(ctx, gw.URL+"/healthz"); err != nil || status != 200 {
		t.Errorf("GET /healthz with NATS down = %d, %v; want 200", status, err)
	}
}
