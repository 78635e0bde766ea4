package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// The command-line client of the README (examples/chat) against a real gateway.

var (
	chatOnce sync.Once
	chatBin  string
	chatErr  error
)

// chatBinary builds examples/chat once.
func chatBinary(tb testing.TB) string {
	tb.Helper()
	chatOnce.Do(func() { chatBin, chatErr = goBuild(binDir, "./examples/chat") })
	if chatErr != nil {
		tb.Fatal(chatErr)
	}
	return chatBin
}

// runChat runs examples/chat with args and returns its stdout, failing the test unless it
// exits 0.
func runChat(tb testing.TB, args ...string) string {
	tb.Helper()
	bin := chatBinary(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("chat %q: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.String()
}

func TestExampleChat(t *testing.T) {
	gw := startGateway(t)
	if got, want := runChat(t, "-url", gw.WS, "hello", "from", "the", "example"), "You said: hello from the example\n"; got != want {
		t.Errorf("chat printed %q, want %q", got, want)
	}

	// -events prints the envelopes; -join replays the same run from its log.
	out := runChat(t, "-url", gw.WS, "-events", "-demo", `{"tokens":3,"intervalMs":0}`, "x")
	var runID string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var env struct {
			ID    string `json:"id"`
			Chunk struct {
				Type  string `json:"type"`
				RunID string `json:"runId"`
			} `json:"chunk"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil || env.ID == "" {
			t.Fatalf("chat -events printed %q, want one envelope per line", line)
		}
		if env.Chunk.Type == "RUN_STARTED" {
			runID = env.Chunk.RunID
		}
	}
	if runID == "" {
		t.Fatalf("chat -events printed no RUN_STARTED:\n%s", out)
	}
	if got, want := runChat(t, "-url", gw.WS, "-join", runID), "t1 t2 t3 \n"; got != want {
		t.Errorf("chat -join %s printed %q, want %q", runID, got, want)
	}
}

// TestExampleChatResumes cuts the example's connection mid-reply: it must resume by itself and
// print the whole reply once.
func TestExampleChatResumes(t *testing.T) {
	gw := startGateway(t)
	px := tcpproxy.Start(t, gw.Addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chatBinary(t), "-url", "ws://"+px.Addr()+"/ws", "-demo", `{"tokens":40,"intervalMs":25}`, "x")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 256)
	cut := 0
	for {
		n, err := stdout.Read(buf)
		out = append(out, buf[:n]...)
		if cut == 0 && bytes.Contains(out, []byte("t5 ")) {
			cut = px.Cut()
		}
		if err != nil {
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("chat: %v\n%s", err, stderr.Bytes())
	}
	if cut != 1 {
		t.Fatalf("cut %d connections, want 1", cut)
	}
	if got, want := string(out), tokensReply(40)+"\n"; got != want {
		t.Errorf("chat printed %q across the cut, want %q", got, want)
	}
	if px.Accepted() != 2 {
		t.Errorf("the proxy accepted %d connections, want 2 (the socket and its resume)", px.Accepted())
	}
}
