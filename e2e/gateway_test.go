package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// gateway is a wsgateway process started by a test.
type gateway struct {
	Addr    string // host:port it listens on
	URL     string // http://Addr
	WS      string // ws://Addr/ws
	NATSURL string // client URL of its embedded NATS server ("" with --nats-url)

	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and its output is read
	waitErr error

	mu   sync.Mutex
	logs bytes.Buffer
}

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 20 * time.Second
)

// startGateway starts the binary with an embedded NATS server in a fresh data directory on a
// free loopback port, waits until /readyz answers 200, and stops the process when the test
// ends: SIGTERM, then kill if it has not exited after stopTimeout. A process that does not exit
// 0 on SIGTERM fails the test. Its log is printed when the test failed.
func startGateway(tb testing.TB, args ...string) *gateway {
	tb.Helper()
	return startGatewayEnv(tb, nil, args...)
}

// startGatewayEnv is startGateway with the environment variables env (NAME=value) besides PATH.
func startGatewayEnv(tb testing.TB, env []string, args ...string) *gateway {
	tb.Helper()
	return startGatewayOn(tb, nil, env, args...)
}

// startGatewayOn is startGatewayEnv on a lab host (nil: in this machine's namespace), where it
// listens on the host's address, port 8080.
func startGatewayOn(tb testing.TB, on *netHost, env []string, args ...string) *gateway {
	tb.Helper()
	if buildErr != nil {
		tb.Fatalf("building the gateway: %v", buildErr)
	}
	args = append([]string{"serve",
		"--addr", "127.0.0.1:0",
		"--data-dir", tb.TempDir(),
		"--log-format", "json",
		"--log-level", "debug",
		"--drain-timeout", "2s",
	}, args...)
	cmd := exec.Command(gatewayBin, args...)
	if on != nil {
		cmd = on.command(gatewayBin, append(args, "--addr", on.Addr+":8080")...)
	}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...) // no WSGATEWAY_* from the test's environment
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", gatewayBin, err)
	}
	g := &gateway{cmd: cmd, done: make(chan struct{})}
	addrc := make(chan startLine, 1)
	go g.readLog(stderr, addrc)
	tb.Cleanup(func() { g.stop(tb) })

	select {
	case l := <-addrc:
		g.Addr, g.NATSURL = l.Addr, l.NATSURL
	case <-g.done:
		tb.Fatalf("gateway exited before listening: %v\n%s", g.waitErr, g.log())
	case <-time.After(startTimeout):
		tb.Fatalf("gateway did not log its address within %v\n%s", startTimeout, g.log())
	}
	g.URL = "http://" + g.Addr
	g.WS = "ws://" + g.Addr + "/ws"
	g.waitReady(tb)
	return g
}

// startLine is what the gateway's start log line says.
type startLine struct {
	Msg     string `json:"msg"`
	Addr    string `json:"addr"`
	NATSURL string `json:"nats_url"`
}

// readLog copies the process's stderr into g.logs, sends the start line to addrc, and reaps
// the process when its stderr closes.
func (g *gateway) readLog(r io.Reader, addrc chan<- startLine) {
	defer close(g.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Bytes()
		g.mu.Lock()
		g.logs.Write(line)
		g.logs.WriteByte('\n')
		g.mu.Unlock()
		if sent {
			continue
		}
		var rec startLine
		if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
			addrc <- rec
			sent = true
		}
	}
	io.Copy(io.Discard, r)
	g.waitErr = g.cmd.Wait()
}

func (g *gateway) log() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.logs.String()
}

// waitReady polls /readyz until it answers 200.
func (g *gateway) waitReady(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		status, _, err := httpGet(ctx, g.URL+"/readyz")
		if err == nil && status == http.StatusOK {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("GET /readyz never answered 200 (last: %d, %v)\n%s", status, err, g.log())
		case <-g.done:
			tb.Fatalf("gateway exited while starting: %v\n%s", g.waitErr, g.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// signal sends sig to the process.
func (g *gateway) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := g.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("signal %v to pid %d: %v", sig, g.cmd.Process.Pid, err)
	}
}

// wait waits until the process has exited and returns its exit error.
func (g *gateway) wait(tb testing.TB, timeout time.Duration) error {
	tb.Helper()
	select {
	case <-g.done:
		return g.waitErr
	case <-time.After(timeout):
		tb.Fatalf("gateway (pid %d) still running after %v", g.cmd.Process.Pid, timeout)
		return nil
	}
}

// stop ends the process by its pid: SIGTERM, then SIGKILL after stopTimeout.
func (g *gateway) stop(tb testing.TB) {
	select {
	case <-g.done:
	default:
		g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done:
			if g.waitErr != nil {
				tb.Errorf("gateway exited with %v after SIGTERM", g.waitErr)
			}
		case <-time.After(stopTimeout):
			g.cmd.Process.Kill()
			<-g.done
			tb.Errorf("gateway did not exit within %v of SIGTERM; killed", stopTimeout)
		}
	}
	if tb.Failed() {
		tb.Logf("gateway log:\n%s", g.log())
	}
}

// httpClient keeps no idle connections, so no transport goroutine outlives a request.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// httpGet returns the status and body of GET url.
func httpGet(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// logRecords returns the process's JSON log records whose msg is msg.
func (g *gateway) logRecords(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(g.log(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// concurrent returns the run frame with multitaskStrategy concurrent: its run starts beside
// the runs of its thread still active, instead of waiting for them (the default, enqueue).
func concurrent(frame []byte) []byte {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(frame, &m); err != nil {
		panic(err)
	}
	m["multitaskStrategy"] = json.RawMessage(`"concurrent"`)
	b, _ := json.Marshal(m)
	return b
}
