package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// jaeger is a Jaeger process (its Go module's cmd/jaeger, built by the separate module
// internal/tools/jaeger) with in-memory storage, its OTLP/HTTP receiver and its query API on
// loopback ports.
type jaeger struct {
	OTLP  string // http://host:port of the OTLP/HTTP receiver
	Query string // http://host:port of the query API
}

// jaegerBin returns the path of the Jaeger binary, building it into the build cache on first
// use (minutes; scripts/test builds it before the tests).
func jaegerBin(tb testing.TB) string {
	tb.Helper()
	root := testenv.MustModuleRoot(tb)
	cmd := exec.Command("go", "tool", "-n", "jaeger")
	cmd.Dir = filepath.Join(root, "internal", "tools", "jaeger")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("go tool -n jaeger (in internal/tools/jaeger): %v\n%s", err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// startJaeger starts Jaeger on free loopback ports, waits until its query API answers, and
// stops it (by its pid) when the test ends.
func startJaeger(tb testing.TB) *jaeger {
	tb.Helper()
	bin := jaegerBin(tb)
	ports := testenv.FreePorts(tb, 3)
	otlp, query, grpc := ports[0], ports[1], ports[2]
	config := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, query, grpc, otlp)
	path := filepath.Join(tb.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", "file:"+path)
	var logs testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start jaeger: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if tb.Failed() {
			tb.Logf("jaeger log:\n%s", logs.String())
		}
	})
	j := &jaeger{OTLP: fmt.Sprintf("http://127.0.0.1:%d", otlp), Query: fmt.Sprintf("http://127.0.0.1:%d", query)}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		status, _, err := httpGet(ctx, j.Query+"/api/services")
		if err == nil && status == http.StatusOK {
			if c, err := (&http.Client{}).Post(j.OTLP+"/v1/traces", "application/json", strings.NewReader("{}")); err == nil {
				c.Body.Close()
				return j
			}
		}
		select {
		case <-exited:
			tb.Fatalf("jaeger exited while starting:\n%s", logs.String())
		case <-ctx.Done():
			tb.Fatalf("jaeger did not answer within %v (last: %d, %v):\n%s", startTimeout, status, err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// jaegerSpan is a span as Jaeger's query API returns it.
type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []jaegerTag `json:"tags"`
	Logs []struct {
		Fields []jaegerTag `json:"fields"`
	} `json:"logs"`
	ProcessID string `json:"processID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

type jaegerTrace struct {
	Spans     []jaegerSpan `json:"spans"`
	Processes map[string]struct {
		ServiceName string      `json:"serviceName"`
		Tags        []jaegerTag `json:"tags"`
	} `json:"processes"`
}

// tag returns the value of the tag key, nil when absent.
func tag(tags []jaegerTag, key string) any {
	for _, t := range tags {
		if t.Key == key {
			return t.Value
		}
	}
	return nil
}

// parent returns the span id of s's CHILD_OF reference, "" for none.
func (s jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// byName returns the spans of tr named name.
func (tr jaegerTrace) byName(name string) []jaegerSpan {
	var out []jaegerSpan
	for _, s := range tr.Spans {
		if s.OperationName == name {
			out = append(out, s)
		}
	}
	return out
}

// waitTrace polls the query API for traceID until it holds a span of each name in want.
func (j *jaeger) waitTrace(tb testing.TB, ctx context.Context, traceID string, want ...string) jaegerTrace {
	tb.Helper()
	var last string
	for {
		status, body, err := httpGet(ctx, j.Query+"/api/traces/"+traceID)
		if err == nil && status == http.StatusOK {
			var resp struct {
				Data []jaegerTrace `json:"data"`
			}
			if json.Unmarshal([]byte(body), &resp) == nil && len(resp.Data) == 1 {
				tr := resp.Data[0]
				missing := false
				for _, name := range want {
					missing = missing || len(tr.byName(name)) == 0
				}
				if !missing {
					return tr
				}
			}
		}
		last = fmt.Sprintf("%d %v %s", status, err, body)
		select {
		case <-ctx.Done():
			tb.Fatalf("trace %s never held the spans %q in Jaeger; last answer: %s", traceID, want, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tracedUpstream is an AG-UI server that records the trace context headers of each turn's
// request.
type tracedUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	headers map[string]http.Header // by runId
}

func startTracedUpstream(tb testing.TB) *tracedUpstream {
	u := &tracedUpstream{headers: map[string]http.Header{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			RunID string `json:"runId"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		u.mu.Lock()
		u.headers[in.RunID] = r.Header.Clone()
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		aguiEvents(w, r, in.RunID, 3, 0, true)
	}))
	tb.Cleanup(u.Close)
	return u
}

func (u *tracedUpstream) header(runID string) http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers[runID]
}

// TestTracingJaeger sends turns with a W3C trace context through a gateway whose agent is an
// AG-UI server, exporting to a real Jaeger: from a run frame's forwardedProps (as a browser
// does), from the WebSocket handshake's headers and from the headers of a POST of the SSE
// transport. Each turn is in Jaeger under the client's trace id, its turn span a child of the
// client's span with the spans of its agent call and its appends and the first event; the
// upstream received the same trace id (and tracestate), the agent span as its parent. A
// resume of the first turn on a second gateway is a span of the same trace, linked to the
// turn, exported by that gateway; a log line of the turn carries its trace id.
func TestTracingJaeger(t *testing.T) {
	j := startJaeger(t)
	up := startTracedUpstream(t)
	env := func(instance string) []string {
		return []string{
			"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLP,
			"OTEL_BSP_SCHEDULE_DELAY=100",
			"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" + instance,
		}
	}
	gwA := startGatewayEnv(t, env("gw-a"), "--agent", "agui", "--agent-url", up.URL+"/agent")
	gwB := startGatewayEnv(t, env("gw-b"), "--nats-url", gwA.NATSURL)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	type tc struct {
		name, runID, traceID, parentID string
		send                           func(runID, traceparent string) string // returns the offset of the first event
	}
	frame := func(runID, props string) []byte { return aguiRunFrame(runID, "hello", props) }
	socketTurn := func(h http.Header, f []byte) string {
		c, _, err := websocket.Dial(ctx, gwA.WS, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		if err := c.Write(ctx, websocket.MessageText, f); err != nil {
			t.Fatal(err)
		}
		var first string
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading the turn: %v", err)
			}
			var env struct {
				ID    string         `json:"id"`
				Chunk map[string]any `json:"chunk"`
			}
			if json.Unmarshal(data, &env) != nil || env.ID == "" {
				continue
			}
			if first == "" {
				first = env.ID
			}
			if typ := env.Chunk["type"]; typ == "RUN_FINISHED" || typ == "RUN_ERROR" {
				if typ != "RUN_FINISHED" {
					t.Fatalf("turn ended %s", data)
				}
				return first
			}
		}
	}
	cases := []tc{
		{name: "forwardedProps", runID: "trace-props", traceID: "4bf92f3577b34da6a3ce929d0e0e4736", parentID: "00f067aa0ba902b7",
			send: func(runID, tp string) string {
				return socketTurn(nil, frame(runID, `{"traceparent":"`+tp+`","tracestate":"vendor=abc"}`))
			}},
		{name: "handshake", runID: "trace-handshake", traceID: "5bf92f3577b34da6a3ce929d0e0e4737", parentID: "10f067aa0ba902b8",
			send: func(runID, tp string) string {
				return socketTurn(http.Header{"Traceparent": {tp}, "Tracestate": {"vendor=abc"}}, frame(runID, `{}`))
			}},
		{name: "sse", runID: "trace-sse", traceID: "6bf92f3577b34da6a3ce929d0e0e4738", parentID: "20f067aa0ba902b9",
			send: func(runID, tp string) string {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gwA.URL+"/api/chat", bytes.NewReader(frame(runID, `{}`)))
				req.Header.Set("Traceparent", tp)
				req.Header.Set("Tracestate", "vendor=abc")
				resp, err := httpClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var first string
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok && first == "" {
						first = id
					}
				}
				if first == "" {
					t.Fatalf("POST /api/chat: %s, no event", resp.Status)
				}
				return first
			}},
	}
	firstOffset := ""
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			first := c.send(c.runID, "00-"+c.traceID+"-"+c.parentID+"-01")
			if i == 0 {
				firstOffset = first
			}
			tr := j.waitTrace(t, ctx, c.traceID, "turn", "agent", "log appends")
			turn := tr.byName("turn")[0]
			if turn.parent() != c.parentID {
				t.Errorf("turn span's parent = %q, want the client's span %s", turn.parent(), c.parentID)
			}
			for key, want := range map[string]any{"wsgateway.run_id": c.runID, "wsgateway.thread_id": "th-agent", "wsgateway.outcome": "completed"} {
				if got := tag(turn.Tags, key); got != want {
					t.Errorf("turn span %s = %v, want %v", key, got, want)
				}
			}
			if h, _ := tag(turn.Tags, "wsgateway.principal_hash").(string); len(h) != 16 || h == "anonymous" {
				t.Errorf("turn span wsgateway.principal_hash = %q, want a 16-digit hash", h)
			}
			firstEvent := false
			for _, l := range turn.Logs {
				if tag(l.Fields, "event") == "first event" && tag(l.Fields, "wsgateway.event_type") == "RUN_STARTED" {
					firstEvent = true
				}
			}
			if !firstEvent {
				t.Errorf("turn span has no first event (RUN_STARTED): %+v", turn.Logs)
			}
			agent := tr.byName("agent")[0]
			if agent.parent() != turn.SpanID {
				t.Errorf("agent span's parent = %q, want the turn %s", agent.parent(), turn.SpanID)
			}
			appends := tr.byName("log appends")
			if len(appends) != 1 || appends[0].parent() != turn.SpanID {
				t.Fatalf("log appends spans %+v, want one, a child of the turn", appends)
			}
			// run.accepted, RUN_STARTED, a message of 3 deltas, RUN_FINISHED.
			if n := tag(appends[0].Tags, "wsgateway.log.appends"); n != float64(8) {
				t.Errorf("log appends span counts %v appends, want 8", n)
			}
			h := up.header(c.runID)
			if want := "00-" + c.traceID + "-" + agent.SpanID + "-01"; h.Get("Traceparent") != want {
				t.Errorf("the upstream received traceparent %q, want %q (the agent span)", h.Get("Traceparent"), want)
			}
			if h.Get("Tracestate") != "vendor=abc" {
				t.Errorf("the upstream received tracestate %q, want vendor=abc", h.Get("Tracestate"))
			}
			logged := false
			for _, rec := range gwA.logRecords("turn ended") {
				if rec["runId"] == c.runID && rec["trace_id"] == c.traceID && rec["span_id"] == turn.SpanID {
					logged = true
				}
			}
			if !logged {
				t.Errorf("no log line \"turn ended\" of %s with trace_id %s and span_id %s", c.runID, c.traceID, turn.SpanID)
			}
		})
	}

	// A resume of the first turn on the second gateway, after its first event, by a client
	// that sends no trace context.
	c := cases[0]
	rs, _, err := websocket.Dial(ctx, gwB.WS+"?runId="+c.runID+"&offset="+firstOffset, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.CloseNow()
	_, status := readUntilClose(t, ctx, rs)
	if status != websocket.StatusNormalClosure {
		t.Fatalf("resume socket closed %d, want 1000", status)
	}
	tr := j.waitTrace(t, ctx, c.traceID, "turn", "resume")
	turn, resume := tr.byName("turn")[0], tr.byName("resume")[0]
	if resume.parent() != turn.SpanID {
		t.Errorf("resume span's parent = %q, want the turn %s (references %+v)", resume.parent(), turn.SpanID, resume.References)
	}
	if got := tag(tr.Processes[resume.ProcessID].Tags, "service.instance.id"); got != "gw-b" {
		t.Errorf("resume span exported by %v, want the second gateway gw-b", got)
	}
	if got := tag(tr.Processes[turn.ProcessID].Tags, "service.instance.id"); got != "gw-a" || tr.Processes[turn.ProcessID].ServiceName != "wsgateway" {
		t.Errorf("turn span exported by %s %v, want wsgateway gw-a", tr.Processes[turn.ProcessID].ServiceName, got)
	}
	// The offset is run.accepted's: the 7 events of the agent after it.
	if n := tag(resume.Tags, "wsgateway.events"); n != float64(7) {
		t.Errorf("resume span sent %v events, want 7", n)
	}

	// A join of the same turn on the second gateway by a client with a trace of its own: a
	// span of that trace, linked to the turn.
	const joinTrace, joinParent = "7bf92f3577b34da6a3ce929d0e0e4739", "30f067aa0ba902ba"
	js, _, err := websocket.Dial(ctx, gwB.WS+"?runId="+c.runID+"&offset=-1", &websocket.DialOptions{
		HTTPHeader: http.Header{"Traceparent": {"00-" + joinTrace + "-" + joinParent + "-01"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer js.CloseNow()
	if _, status := readUntilClose(t, ctx, js); status != websocket.StatusNormalClosure {
		t.Fatalf("join socket closed %d, want 1000", status)
	}
	join := j.waitTrace(t, ctx, joinTrace, "join").byName("join")[0]
	linked := false
	for _, r := range join.References {
		linked = linked || (r.RefType == "FOLLOWS_FROM" && r.SpanID == turn.SpanID && r.TraceID == c.traceID)
	}
	if join.parent() != joinParent || !linked {
		t.Errorf("join span's references %+v, want a child of %s linked to the turn %s", join.References, joinParent, turn.SpanID)
	}
	if n := tag(join.Tags, "wsgateway.events"); n != float64(8) {
		t.Errorf("join span sent %v events, want 8", n)
	}
}
