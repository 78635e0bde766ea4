package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/protocol"
)

func TestChecker(t *testing.T) {
	ev := func(typ, delta string) event { return event{Type: typ, Delta: delta} }
	accepted := event{Type: "CUSTOM", Name: acceptedName}
	script := []event{accepted, ev("RUN_STARTED", ""), ev("TEXT_MESSAGE_START", ""),
		ev("TEXT_MESSAGE_CONTENT", "t1 "), ev("TEXT_MESSAGE_CONTENT", "t2 "), ev("TEXT_MESSAGE_END", ""), ev("RUN_FINISHED", "")}
	type frame struct {
		id string
		ev event
	}
	frames := func(evs []event) []frame {
		var out []frame
		for i, e := range evs {
			out = append(out, frame{strconv.Itoa(i), e})
		}
		return out
	}
	tests := []struct {
		name    string
		frames  []frame
		wantErr error // nil: complete and correct
	}{
		{"complete", frames(script), nil},
		{"without run.accepted", frames(script[1:]), nil},
		{"gap", frames(append(append([]event{}, script[:3]...), script[4:]...)), errGap},
		{"reordered", frames([]event{accepted, script[1], script[2], script[4], script[3]}), errGap},
		{"duplicate offset", append(frames(script[:4]), frame{"3", script[4]}), errDuplicate},
		{"event after the end", append(frames(script), frame{"9", accepted}), errAfterEnd},
		{"no offset", []frame{{"", accepted}}, errNoOffset},
		{"wrong delta", frames([]event{accepted, script[1], script[2], ev("TEXT_MESSAGE_CONTENT", "t2 ")}), errGap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newChecker(2)
			var err error
			for _, f := range tt.frames {
				if err = c.add(f.id, &f.ev); err != nil {
					break
				}
			}
			if tt.wantErr == nil {
				if err != nil || !c.done {
					t.Fatalf("checker: err %v, done %v; want a complete turn", err, c.done)
				}
				if c.events != scriptLen(2)-(len(script)-len(tt.frames)) {
					t.Errorf("events = %d, want %d", c.events, len(tt.frames))
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("checker error = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestHistogramSummary(t *testing.T) {
	// 100 observations: 50 in (0, 1 ms], 49 in (1, 2 ms], 1 in (2, 4 ms].
	h := &histogram{le: []float64{0.001, 0.002, 0.004, inf}, count: []float64{50, 99, 100, 100}}
	before := &histogram{le: h.le, count: []float64{0, 0, 0, 0}}
	p := h.sub(before).summary()
	if p.N != 100 || p.P50 != 1 {
		t.Errorf("summary = %+v, want n=100 p50=1ms", p)
	}
	if p.P99 != 2 {
		t.Errorf("p99 = %v ms, want 2", p.P99)
	}
	if p.Max != 4 {
		t.Errorf("max = %v ms, want 4", p.Max)
	}
}

var inf = math.Inf(1)

// wsbenchRun runs the command in process and returns its exit status and output.
func wsbenchRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func decodeReport(t *testing.T, out string) *report {
	t.Helper()
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	return &rep
}

// checkLoad asserts what a user of the tool relies on: every turn complete, every event counted
// once, the replays whole, the server's memory read.
func checkLoad(t *testing.T, rep *report, sockets, turns, tokens, replays int) {
	t.Helper()
	if rep.Errors != 0 || rep.TurnsFailed != 0 {
		t.Fatalf("errors %d, failed turns %d: %q", rep.Errors, rep.TurnsFailed, rep.ErrorSample)
	}
	if want := int64(sockets * turns); rep.TurnsCompleted != want {
		t.Errorf("turns completed = %d, want %d", rep.TurnsCompleted, want)
	}
	if want := int64(sockets * turns * scriptLen(tokens)); rep.Events != want {
		t.Errorf("events = %d, want %d (each event exactly once)", rep.Events, want)
	}
	if rep.EventsPerSec <= 0 || rep.FirstEventLatency == nil || rep.FirstEventLatency.N != sockets*turns {
		t.Errorf("events/s %v, first-event latency %+v: want a rate and one sample per turn", rep.EventsPerSec, rep.FirstEventLatency)
	}
	// Every agent event is timestamped (run.accepted, the server's, is not measured).
	if want := sockets * turns * (scriptLen(tokens) - 1); rep.EventLatency == nil || rep.EventLatency.N != want {
		t.Errorf("event latency %+v: want one sample per agent event, %d", rep.EventLatency, want)
	}
	if rep.ClientCPUUsPerEvent <= 0 {
		t.Errorf("client CPU per event = %v, want it measured", rep.ClientCPUUsPerEvent)
	}
	if rep.RSSBaseBytes <= 0 || rep.RSSIdleBytes <= 0 {
		t.Errorf("server RSS base %d idle %d: want both measured", rep.RSSBaseBytes, rep.RSSIdleBytes)
	}
	if rep.Replay == nil || rep.Replay.Runs != replays || rep.Replay.Events != int64(replays*scriptLen(tokens)) {
		t.Errorf("replay = %+v, want %d runs of %d events", rep.Replay, replays, scriptLen(tokens))
	}
}

func TestLoadGateway(t *testing.T) {
	gw := startProcess(t, "gateway", buildGateway(t), "serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-format", "json", "--log-level", "info", "--drain-timeout", "2s")
	const sockets, turns, tokens = 20, 2, 20
	code, out, errOut := wsbenchRun(t, "--url", "ws://"+gw.addr+"/ws", "--pid", strconv.Itoa(gw.pid), "--timestamps",
		"--metrics-url", "http://"+gw.addr+"/metrics", "--sockets", strconv.Itoa(sockets), "--turns", strconv.Itoa(turns),
		"--tokens", strconv.Itoa(tokens), "--interval-ms", "1", "--drop", "0.03", "--replay", "2",
		"--idle-settle", "100ms", "--idle-after", "2s", "--sample-every", "1s", "--progress", "0", "--json")
	if code != 0 {
		t.Fatalf("wsbench exit %d\n%s\n%s", code, out, errOut)
	}
	rep := decodeReport(t, out)
	checkLoad(t, rep, sockets, turns, tokens, 2)
	// The idle curve: a sample at once and one a second for 2 s, each with the server's RSS.
	if len(rep.IdleCurve) != 3 {
		t.Errorf("idle curve %+v: want 3 samples, at 0, 1 and 2 s", rep.IdleCurve)
	}
	for _, x := range rep.IdleCurve {
		if x.RSSBytes <= 0 || x.Goroutines <= 0 {
			t.Errorf("idle sample %+v: want the server's RSS and goroutines", x)
		}
	}
	// About 30 drops are expected among 1,000 events: the resumes must have happened, and
	// checkLoad proved each of those turns still arrived whole and once.
	if rep.Resumes == 0 {
		t.Errorf("resumes = 0 with --drop 0.03 over %d events", rep.Events)
	}
	if rep.ServerDelivery == nil || rep.ServerDelivery.N < int(rep.Events)/2 {
		t.Errorf("server delivery histogram = %+v, want the gateway's observations", rep.ServerDelivery)
	}
	// 40 turns grow the gateway's heap: some of its memory must be fresh pages.
	if rep.ServerCPUSeconds <= 0 || rep.ServerMinorFaults <= 0 {
		t.Errorf("server CPU %.3f s, %d minor faults: want both read from /proc", rep.ServerCPUSeconds, rep.ServerMinorFaults)
	}
}

// TestIdleSockets: sockets that stream no turn stay open through the server's heartbeats
// (their reads answer its pings, from their dial on), and a socket the server closes while
// they idle is an error.
func TestIdleSockets(t *testing.T) {
	bin := buildGateway(t)
	gwArgs := []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json",
		"--log-level", "info", "--drain-timeout", "2s"}
	const sockets = 20
	idle := func(t *testing.T, gw *process, settle string) (int, *report, string) {
		code, out, errOut := wsbenchRun(t, "--url", "ws://"+gw.addr+"/ws", "--pid", strconv.Itoa(gw.pid),
			"--sockets", strconv.Itoa(sockets), "--turns", "0", "--idle-settle", settle, "--progress", "0", "--json")
		return code, decodeReport(t, out), errOut
	}
	t.Run("heartbeats", func(t *testing.T) {
		// Pings every second go unanswered for the pong timeout (10 s) unless the sockets
		// read: 14 s in, every socket must still be open.
		gw := startProcess(t, "gateway", bin, append(gwArgs, "--heartbeat", "1s")...)
		open := make(chan int64, 1)
		go func() {
			time.Sleep(14 * time.Second)
			var n int64
			for line := range strings.Lines(string(scrape(context.Background(), "http://"+gw.addr+"/metrics"))) {
				if rest, ok := strings.CutPrefix(line, "wsgateway_conversation_open_sockets{"); ok && strings.Contains(rest, `kind="conversation"`) {
					v, _ := strconv.ParseFloat(strings.TrimSpace(rest[strings.LastIndexByte(rest, ' '):]), 64)
					n += int64(v)
				}
			}
			open <- n
		}()
		code, rep, errOut := idle(t, gw, "16s")
		if code != 0 || rep.Errors != 0 {
			t.Fatalf("wsbench exit %d, errors %d %q\n%s", code, rep.Errors, rep.ErrorSample, errOut)
		}
		if n := <-open; n != sockets {
			t.Errorf("open conversation sockets 14 s in = %d, want %d", n, sockets)
		}
	})
	t.Run("closed", func(t *testing.T) {
		gw := startProcess(t, "gateway", bin, append(gwArgs, "--idle-timeout", "1s")...)
		code, rep, _ := idle(t, gw, "4s")
		if code == 0 || rep.Errors != sockets {
			t.Fatalf("wsbench exit %d, errors %d, with every socket closed by the server's idle timeout: want an error per socket", code, rep.Errors)
		}
	})
}

func TestLoadReference(t *testing.T) {
	root := testenv.MustModuleRoot(t)
	if _, err := os.Stat(filepath.Join(root, "bench", "node_modules", "@tanstack", "ai")); err != nil {
		t.Fatalf("the reference server's packages are missing: run (cd bench && npm ci): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed for the reference server: %v", err)
	}
	ref := startProcess(t, "reference", node, filepath.Join(root, "bench", "reference-server.mjs"), "--addr", "127.0.0.1:0")
	const sockets, turns, tokens = 20, 2, 20
	code, out, errOut := wsbenchRun(t, "--url", "ws://"+ref.addr+"/ws", "--pid", strconv.Itoa(ref.pid), "--timestamps",
		"--sockets", strconv.Itoa(sockets), "--turns", strconv.Itoa(turns), "--tokens", strconv.Itoa(tokens),
		"--interval-ms", "0", "--replay", "2", "--idle-settle", "100ms", "--progress", "0", "--json")
	if code != 0 {
		t.Fatalf("wsbench exit %d\n%s\n%s", code, out, errOut)
	}
	checkLoad(t, decodeReport(t, out), sockets, turns, tokens, 2)
}

// TestLoadFindsGap runs wsbench against a server that skips one delta of every turn: the run
// must fail and say why.
func TestLoadFindsGap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		_, data, err := c.Read(r.Context())
		if err != nil {
			return
		}
		var in struct {
			RunID          string `json:"runId"`
			ForwardedProps struct {
				Demo struct{ Timestamps bool }
			}
		}
		json.Unmarshal(data, &in)
		if !in.ForwardedProps.Demo.Timestamps {
			t.Errorf("run frame %s does not ask for timestamps", data)
		}
		events := []string{`{"type":"RUN_STARTED"}`, `{"type":"TEXT_MESSAGE_START"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","delta":"t1 "}`, `{"type":"TEXT_MESSAGE_CONTENT","delta":"t3 "}`,
			`{"type":"TEXT_MESSAGE_END"}`, `{"type":"RUN_FINISHED"}`}
		for i, e := range events {
			c.Write(r.Context(), websocket.MessageText, fmt.Appendf(nil, `{"id":"%s-%d","chunk":%s}`, in.RunID, i, e))
		}
		c.Read(r.Context()) // until the client closes
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := wsbenchRun(t, "--url", "ws"+strings.TrimPrefix(srv.URL, "http"), "--sockets", "2", "--timestamps",
		"--tokens", "3", "--idle-settle", "0s", "--progress", "0", "--json")
	if code != 1 {
		t.Fatalf("wsbench exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	rep := decodeReport(t, out)
	if rep.Errors != 2 || rep.TurnsCompleted != 0 || len(rep.ErrorSample) == 0 || !strings.Contains(rep.ErrorSample[0], errGap.Error()) {
		t.Errorf("errors %d, turns %d, sample %q: want both turns failed with %q", rep.Errors, rep.TurnsCompleted, rep.ErrorSample, errGap)
	}
}

// TestLoadTurnTimeout runs wsbench against a server that never ends its turns: each turn must
// fail at --turn-timeout with the context's error, the run must end, and say why.
func TestLoadTurnTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if _, _, err := c.Read(r.Context()); err != nil {
			return
		}
		c.Write(r.Context(), websocket.MessageText, []byte(`{"id":"1","chunk":{"type":"RUN_STARTED"}}`))
		c.Read(r.Context()) // until the client closes
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := wsbenchRun(t, "--url", "ws"+strings.TrimPrefix(srv.URL, "http"), "--sockets", "3",
		"--turns", "2", "--tokens", "3", "--turn-timeout", "200ms", "--idle-settle", "0s", "--progress", "0", "--json")
	if code != 1 {
		t.Fatalf("wsbench exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	rep := decodeReport(t, out)
	// The first turn of each socket times out; the second cannot start on the closed socket,
	// which is redialed and times out too.
	if rep.TurnsFailed != 6 || rep.TurnsCompleted != 0 || len(rep.ErrorSample) == 0 ||
		!strings.Contains(rep.ErrorSample[0], context.DeadlineExceeded.Error()) {
		t.Errorf("failed %d, completed %d, sample %q: want every turn failed with %q",
			rep.TurnsFailed, rep.TurnsCompleted, rep.ErrorSample, context.DeadlineExceeded)
	}
}

func TestSinceTimestamp(t *testing.T) {
	recv := time.UnixMicro(1764471296123456 + 2500)
	for _, tt := range []struct {
		ms   float64
		want time.Duration
	}{
		{1764471296123.456, 2500 * time.Microsecond},
		{1764471296123, 2956 * time.Microsecond}, // a whole-millisecond AG-UI 1.0 timestamp
		{1764471296126, -44 * time.Microsecond},
	} {
		if got := sinceTimestamp(recv, tt.ms); got != tt.want {
			t.Errorf("sinceTimestamp(%v) = %v, want %v", tt.ms, got, tt.want)
		}
	}
}

// The emit time is the metadata's microseconds when the event has them, else its timestamp.
func TestEventEmitTime(t *testing.T) {
	var f, meta protocol.Fields
	for _, tt := range []struct {
		event string
		want  float64
	}{
		{`{"type":"TEXT_MESSAGE_CONTENT","timestamp":1764471296123,"metadata":{"emitMicros":1764471296123456}}`, 1764471296123.456},
		{`{"type":"TEXT_MESSAGE_CONTENT","timestamp":1764471296123}`, 1764471296123},
		{`{"type":"TEXT_MESSAGE_CONTENT","timestamp":1764471296123,"metadata":{"other":1}}`, 1764471296123},
		{`{"type":"TEXT_MESSAGE_CONTENT"}`, 0},
	} {
		if err := f.Parse([]byte(tt.event)); err != nil {
			t.Fatal(err)
		}
		if got := eventOf(&f, &meta).Timestamp; got != tt.want {
			t.Errorf("%s: emit time %v, want %v", tt.event, got, tt.want)
		}
	}
}

func TestRawBaselines(t *testing.T) {
	tests := []struct {
		args    []string
		want    int64
		latency bool // a paced run: every publish's latency measured
	}{
		{[]string{"raw-websocket", "--conns", "3", "--frames", "200", "--json"}, 600, false},
		{[]string{"raw-jetstream", "--msgs", "1000", "--publishers", "2", "--data-dir", t.TempDir(), "--json"}, 1000, false},
		{[]string{"raw-jetstream", "--msgs", "200", "--publishers", "4", "--rate", "400", "--data-dir", t.TempDir(), "--json"}, 200, true},
	}
	for _, tt := range tests {
		name := tt.args[0]
		if tt.latency {
			name += " paced"
		}
		t.Run(name, func(t *testing.T) {
			code, out, errOut := wsbenchRun(t, tt.args...)
			if code != 0 {
				t.Fatalf("wsbench %q exit %d\n%s", tt.args, code, errOut)
			}
			var rep rawReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Messages != tt.want || rep.PerSec <= 0 {
				t.Errorf("wsbench %q = %+v, want %d messages and a rate", tt.args, rep, tt.want)
			}
			if got := rep.Latency != nil && int64(rep.Latency.N) == tt.want && rep.Latency.P50 > 0; got != tt.latency {
				t.Errorf("wsbench %q latency = %+v, want measured: %t", tt.args, rep.Latency, tt.latency)
			}
		})
	}
}

func TestTable(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, v := range []float64{60000, 90000, 80000} {
		write(fmt.Sprintf("throughput.gateway.%d.json", i), &report{EventsPerSec: v})
	}
	for i, v := range []float64{30000, 40000} {
		write(fmt.Sprintf("throughput.reference.%d.json", i), &report{EventsPerSec: v})
	}
	write("raw-jetstream.machine.1.json", &rawReport{PerSec: 100000})
	// A fleet run: two gateways loaded at once, 3,000 sockets in all, 24,000 KiB over their
	// RSS before the sockets.
	write("fleet.gateway.1-1.json", &report{Sockets: 1000, RSSBaseBytes: 10 << 20, RSSIdleBytes: 10<<20 + 8000<<10})
	write("fleet.gateway.1-2.json", &report{Sockets: 2000, RSSBaseBytes: 20 << 20, RSSIdleBytes: 20<<20 + 16000<<10, Errors: 1})
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"table", dir}, &out, &errOut); code != 0 {
		t.Fatalf("table exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{
		"| throughput, events/s delivered | 80000 (n=3) | 35000 (n=2) | 2.29× |",
		"| raw JetStream async publishes/s | 100000 (n=1) |  | 0.80× |",
		"| idle sockets on 2 gateways sharing one NATS, RSS per socket (KiB) | 8.0 (n=1) for 3000 sockets, 1 errors |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table does not contain %q:\n%s", want, out.String())
		}
	}

	// bench/run compare: another build's results beside these, with the ratio of the two.
	base := t.TempDir()
	b, _ := json.Marshal(&report{EventsPerSec: 40000})
	if err := os.WriteFile(filepath.Join(base, "throughput.gateway.1.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"table", "--compare", base, "--base-name", "abf503b", dir}, &out, &errOut); code != 0 {
		t.Fatalf("table --compare exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{
		"| figure | this tree | abf503b | tree / abf503b | anchor | tree / anchor | target |",
		"| throughput, events/s delivered | 80000 (n=3) | 40000 (n=1) | 2.00× | 35000 (n=2) | 2.29× |",
		"| raw JetStream async publishes/s | 100000 (n=1) | - | - |  | 0.80× |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table --compare does not contain %q:\n%s", want, out.String())
		}
	}
}

var build struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// TestMain removes the gateway buildGateway compiled, once every test is done. With
// WSBENCH_TEST_MAIN=1 the test binary is wsbench itself, as the processes wsbench starts of
// itself (wsbench hostile --flood-cpus) need.
func TestMain(m *testing.M) {
	if os.Getenv("WSBENCH_TEST_MAIN") == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	if build.bin != "" {
		os.RemoveAll(filepath.Dir(build.bin))
	}
	os.Exit(code)
}

// buildGateway compiles cmd/wsgateway once per test binary, for every test that asks.
func buildGateway(t *testing.T) string {
	t.Helper()
	root := testenv.MustModuleRoot(t)
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "wsbench-test-")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "wsgateway")
		cmd := exec.Command("go", "build", "-o", build.bin, "./cmd/wsgateway")
		cmd.Dir = root
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("go build ./cmd/wsgateway: %v\n%s", build.err, build.out)
	}
	return build.bin
}

// process is a server started by a test.
type process struct {
	addr string
	pid  int
}

// startProcess starts a server that logs a JSON line {"msg":"listening","addr":…} (on stdout
// or stderr), waits for that line, and stops it by its pid when the test ends.
func startProcess(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, name, bin, nil, args...)
}

// startProcessEnv is startProcess with env (NAME=value) added to the process's environment.
func startProcessEnv(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var logMu sync.Mutex
	var logs bytes.Buffer
	addrc := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		pw.Close()
		close(exited)
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			logMu.Lock()
			logs.Write(sc.Bytes())
			logs.WriteByte('\n')
			logMu.Unlock()
			var rec struct{ Msg, Addr string }
			if !sent && json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				addrc <- rec.Addr
				sent = true
			}
		}
		io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("%s (pid %d) did not exit within 20 s of SIGTERM; killed", name, cmd.Process.Pid)
		}
		if t.Failed() {
			logMu.Lock()
			t.Logf("%s log:\n%s", name, logs.String())
			logMu.Unlock()
		}
	})
	select {
	case addr := <-addrc:
		p := &process{addr: addr, pid: cmd.Process.Pid}
		waitHTTP(t, "http://"+addr+"/readyz")
		return p
	case <-exited:
		t.Fatalf("%s exited before listening", name)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not log its address within 60 s", name)
	}
	return nil
}

// waitHTTP polls u until it answers 200.
func waitHTTP(t *testing.T, u string) {
	t.Helper()
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s never answered 200: %v", u, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
