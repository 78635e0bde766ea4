package conversation_test

import (
	"go.opentelemetry.io/otel/trace"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/threadstore"
	"github.com/wsgateway/wsgateway/turn"
	"github.com/wsgateway/wsgateway/usage"
)

// The idle sockets' poller lives as long as the process (poller_linux.go).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/wsgateway/wsgateway/conversation.(*poller).run"))
}

// script is what the test agent does, read from forwardedProps.test of the run frame.
type script struct {
	Tokens     int    `json:"tokens"`     // content deltas per run, "t<i> "
	IntervalMs int    `json:"intervalMs"` // pause before each delta
	Runs       int    `json:"runs"`       // RUN_STARTED…RUN_FINISHED pairs (default 1)
	Fail       string `json:"fail"`       // "start" or "middle": the agent fails there
	Invalid    bool   `json:"invalid"`    // a content delta of an unknown message midway
	NoTerminal bool   `json:"noTerminal"` // end without RUN_FINISHED
	Block      bool   `json:"block"`      // after the deltas, wait for the context
	DeltaBytes int    `json:"deltaBytes"` // pad each delta to this size
	Usage      int    `json:"usage"`      // RUN_FINISHED reports 1 input and this many output tokens (model "m-test")
}

// testAgent is the agent of these tests: deterministic, driven by the run frame.
type testAgent struct{}

func (testAgent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	var props struct {
		Test script `json:"test"`
	}
	if len(in.ForwardedProps) > 0 {
		if err := json.Unmarshal(in.ForwardedProps, &props); err != nil {
			return err
		}
	}
	sc := props.Test
	if sc.Runs == 0 {
		sc.Runs = 1
	}
	if sc.Fail == "start" {
		return errors.New("agent failed at start")
	}
	ev := func(format string, args ...any) error { return emit([]byte(fmt.Sprintf(format, args...))) }
	for run := 1; run <= sc.Runs; run++ {
		msg := fmt.Sprintf("m-%s-%d", in.RunID, run)
		if err := ev(`{"type":"RUN_STARTED","threadId":%q,"runId":%q}`, in.ThreadID, in.RunID); err != nil {
			return err
		}
		if err := ev(`{"type":"TEXT_MESSAGE_START","messageId":%q,"role":"assistant"}`, msg); err != nil {
			return err
		}
		for i := 1; i <= sc.Tokens; i++ {
			if sc.IntervalMs > 0 {
				select {
				case <-time.After(time.Duration(sc.IntervalMs) * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if i == sc.Tokens/2+1 {
				if sc.Fail == "middle" {
					return errors.New("agent failed midway")
				}
				if sc.Invalid {
					if err := ev(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"nope","delta":"x"}`); err != nil {
						return err
					}
				}
			}
			delta := fmt.Sprintf("t%d ", i)
			if len(delta) < sc.DeltaBytes {
				delta += strings.Repeat("x", sc.DeltaBytes-len(delta))
			}
			if err := ev(`{"type":"TEXT_MESSAGE_CONTENT","messageId":%q,"delta":%q}`, msg, delta); err != nil {
				return err
			}
		}
		if sc.Block {
			<-ctx.Done()
			return ctx.Err()
		}
		if err := ev(`{"type":"TEXT_MESSAGE_END","messageId":%q}`, msg); err != nil {
			return err
		}
		if sc.NoTerminal && run == sc.Runs {
			return nil
		}
		var used string
		if sc.Usage > 0 {
			used = fmt.Sprintf(`,"usage":[{"model":"m-test","inputTokens":1,"outputTokens":%d,"totalTokens":%d}]`, sc.Usage, sc.Usage+1)
		}
		if err := ev(`{"type":"RUN_FINISHED","threadId":%q,"runId":%q%s}`, in.ThreadID, in.RunID, used); err != nil {
			return err
		}
	}
	return nil
}

// runFrame is a run frame for runID with the test agent's script.
func runFrame(runID string, sc script) []byte {
	b, _ := json.Marshal(map[string]any{
		"threadId":       "thread-1",
		"runId":          runID,
		"messages":       []any{map[string]any{"id": "u1", "role": "user", "content": "hello"}},
		"forwardedProps": map[string]any{"test": sc},
	})
	return b
}

func abortFrame(runID string) []byte {
	return []byte(fmt.Sprintf(`{"type":"abort","runId":%q}`, runID))
}

// env is one gateway: a Store on NATS (or a memStore), a Server, an HTTP server.
type env struct {
	logs    conversation.Store // the Server's, before envOptions.wrap
	store   *jetstream.Store
	threads *threadstore.Store
	srv     *conversation.Server
	http    *httptest.Server
	reg     *prometheus.Registry
	ledger  *usage.Ledger // envOptions.usage; nil: none
}

type envOptions struct {
	natsURL           string // empty: start an embedded server
	maxThreads        int    // the thread store's MaxThreadsPerPrincipal (0: no bound)
	abortOnDisconnect bool
	heartbeat         heartbeat.Config
	queueSize         int
	writeTimeout      time.Duration // Config.WriteTimeout; 0: the default
	serverTimeout     time.Duration // http.Server ReadTimeout and WriteTimeout; 0: none
	// Per-socket and per-principal limits (0: the defaults).
	maxTurns      int
	maxSockets    int
	runFrameRate  float64
	runFrameBurst int
	maxFollows    int
	// The per-principal bounds of turns and hydrates. 0: so high that they hold nothing back
	// (every test's requests are of one principal), but for the tests of these bounds.
	principalTurns    int
	turnStartRate     float64
	turnStartBurst    int
	principalHydrates int
	principalLimits   map[string]conversation.PrincipalLimits
	refusalDelay      time.Duration // 0: the default
	// wrap, if set, wraps the Store the Server uses; wrapThreads its Threads.
	wrap        func(conversation.Store) conversation.Store
	wrapThreads func(conversation.Threads) conversation.Threads
	// tokens, if set, authenticates requests (Config.Tokens) instead of X-Principal.
	tokens conversation.Tokens
	// retention of run logs (0: the store's default).
	retention time.Duration
	// tracer, if set, traces turns and replays (Config.TracerProvider).
	tracer trace.TracerProvider
	// leaseTTL of the store's leases (0: the store's default).
	leaseTTL time.Duration
	// replayPatience is Config.ReplayPatience (0: the default).
	replayPatience time.Duration
	// replay takes over the runs of dead gateways (Config.Replay); agent, if set, replaces
	// testAgent.
	replay bool
	agent  turn.Agent
	// budget is the Server's memory budget (nil: none).
	budget *budget.Budget
	// usage, if set, opens a usage ledger on the store with this Config (Config.Usage).
	usage *usage.Config
	// historyClient and historyBytes are the Server's Config.AgentHistoryClient and
	// AgentHistoryBytes.
	historyClient bool
	historyBytes  int
	// multitask is the Server's Config.Multitask ("": the default).
	multitask string
	// memory runs the gateway on a memStore, without NATS and without threads: for the
	// tests in which NATS is beside the point. env.store and env.threads are nil then.
	memory bool
	// memThreads, with memory, keeps threads in memory (memThreads).
	memThreads bool
}

// newEnv starts a gateway. Without a NATS URL it starts an embedded NATS server with
// JetStream in a temporary directory. The principal of a request is its X-Principal header
// ("p1" when absent).
func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.Config{URLs: o.natsURL, JoinWait: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Retention: o.retention, LeaseTTL: o.leaseTTL}
	if o.retention != 0 {
		cfg.DedupWindow = o.retention / 2
	}
	if o.natsURL == "" {
		cfg.DataDir = t.TempDir()
	}
	var store *jetstream.Store
	var ts *threadstore.Store
	var cs conversation.Store = newMemStore()
	var threads conversation.Threads
	if o.memThreads {
		threads = newMemThreads()
	}
	if !o.memory {
		var err error
		if store, err = jetstream.Open(ctx, cfg); err != nil {
			t.Fatalf("jetstream.Open() = %v", err)
		}
		ts, err = threadstore.Open(ctx, store, threadstore.Config{MaxThreadsPerPrincipal: o.maxThreads,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			store.Close()
			t.Fatalf("threadstore.Open() = %v", err)
		}
		cs, threads = conversation.RunStore(store), conversation.ThreadStore(ts)
	}
	reg := prometheus.NewRegistry()
	if o.heartbeat.Interval == 0 {
		o.heartbeat.Interval = time.Hour // tests that count frames see no pings
	}
	const unbounded = 1 << 20
	for _, v := range []*int{&o.principalTurns, &o.turnStartBurst, &o.principalHydrates} {
		if *v == 0 {
			*v = unbounded
		}
	}
	if o.turnStartRate == 0 {
		o.turnStartRate = unbounded
	}
	var ledger *usage.Ledger
	if o.usage != nil {
		uc := *o.usage
		uc.JetStream = store.JetStream()
		var err error
		if ledger, err = usage.New(ctx, uc); err != nil {
			t.Fatalf("usage.New() = %v", err)
		}
	}
	logs := cs
	if o.wrap != nil {
		cs = o.wrap(cs)
	}
	if o.wrapThreads != nil {
		threads = o.wrapThreads(threads)
	}
	var ag turn.Agent = testAgent{}
	if o.agent != nil {
		ag = o.agent
	}
	srv, err := conversation.New(conversation.Config{
		Store:                   cs,
		Threads:                 threads,
		Agent:                   ag,
		Replay:                  o.replay,
		AgentHistoryClient:      o.historyClient,
		AgentHistoryBytes:       o.historyBytes,
		Multitask:               o.multitask,
		TracerProvider:          o.tracer,
		Heartbeat:               o.heartbeat,
		QueueSize:               o.queueSize,
		ReplayPatience:          o.replayPatience,
		AbortOnDisconnect:       o.abortOnDisconnect,
		MaxTurnsPerSocket:       o.maxTurns,
		MaxSocketsPerPrincipal:  o.maxSockets,
		RunFrameRate:            o.runFrameRate,
		RunFrameBurst:           o.runFrameBurst,
		MaxFollowsPerSocket:     o.maxFollows,
		MaxTurnsPerPrincipal:    o.principalTurns,
		TurnStartRate:           o.turnStartRate,
		TurnStartBurst:          o.turnStartBurst,
		MaxHydratesPerPrincipal: o.principalHydrates,
		PrincipalLimits:         o.principalLimits,
		RefusalDelay:            o.refusalDelay,
		WriteTimeout:            o.writeTimeout,
		Principal: func(r *http.Request) (string, error) {
			if p := r.Header.Get("X-Principal"); p != "" {
				return p, nil
			}
			return "p1", nil
		},
		Tokens:  o.tokens,
		Budget:  o.budget,
		Usage:   ledger,
		Metrics: metrics.New(reg),
		Logger:  slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("conversation.New() = %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ws", srv)
	mux.Handle("/api/chat", srv.HTTPHandler(conversation.SSE))
	mux.Handle("/api/chat/ndjson", srv.HTTPHandler(conversation.NDJSON))
	mux.Handle("POST /api/runs/{runId}/abort", srv.AbortHandler())
	mux.Handle("/agui", srv.HTTPHandler(conversation.AGUI))
	mux.Handle("POST /api/threads/{threadId}/runs", srv.ThreadRunsHandler("/api/chat"))
	mux.Handle("POST /api/threads/{threadId}/branch", srv.BranchHandler())
	mux.Handle("GET /api/threads", srv.ThreadsHandler())
	mux.Handle("DELETE /api/threads/{threadId}", srv.ThreadsHandler())
	mux.Handle("GET /api/usage", srv.UsageHandler())
	hs := httptest.NewUnstartedServer(mux)
	hs.Config.ReadTimeout, hs.Config.WriteTimeout = o.serverTimeout, o.serverTimeout
	hs.Start()
	e := &env{logs: logs, store: store, threads: ts, srv: srv, http: hs, reg: reg, ledger: ledger}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		ledger.Close(ctx)
		if store != nil {
			ts.Close()
			store.Close()
		}
	})
	return e
}

// testWriter writes log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// url returns the ws:// URL of /ws with query parameters (name, value pairs).
func (e *env) url(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u := "ws" + strings.TrimPrefix(e.http.URL, "http") + "/ws"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// metric returns the sum of the counter or gauge series whose label values, joined with
// commas in the order of the label names, are label or start with it ("conversation" sums
// the transports of open_sockets{kind="conversation"}; "" names an unlabelled series).
func (e *env) metric(t testing.TB, name, label string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	var sum float64
	found := false
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			values := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				values = append(values, l.GetValue())
			}
			if joined := strings.Join(values, ","); len(values) > 0 && joined != label && !strings.HasPrefix(joined, label+",") {
				continue
			}
			sum += value(m)
			found = true
		}
	}
	if !found {
		t.Fatalf("no series %s{%s}", name, label)
	}
	return sum
}

// waitMetric waits until a series has the value want.
func (e *env) waitMetric(t testing.TB, name, label string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.metric(t, name, label) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s} = %v after 10s, want %v", name, label, e.metric(t, name, label), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// client is a test WebSocket client.
type client struct {
	t    testing.TB
	c    *websocket.Conn
	ctx  context.Context
	done context.CancelFunc
}

// dial opens a socket; principal "" means the default one.
func dial(t testing.TB, u, principal string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	h := http.Header{}
	if principal != "" {
		h.Set("X-Principal", principal)
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		cancel()
		t.Fatalf("Dial(%s) = %v", u, err)
	}
	c.SetReadLimit(1 << 24)
	cl := &client{t: t, c: c, ctx: ctx, done: cancel}
	t.Cleanup(func() {
		c.CloseNow()
		cancel()
	})
	return cl
}

func (cl *client) send(data []byte) {
	cl.t.Helper()
	if err := cl.c.Write(cl.ctx, websocket.MessageText, data); err != nil {
		cl.t.Fatalf("Write() = %v", err)
	}
}

// frame is a received frame; err is set when the socket ended (with close code and reason).
type frame struct {
	protocol.ServerFrame
	raw    string
	code   websocket.StatusCode // -1: not a close frame
	reason string
	err    error
}

// next returns the next frame that is not a ping, or the end of the socket.
func (cl *client) next(timeout time.Duration) frame {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(cl.ctx, timeout)
	defer cancel()
	for {
		typ, data, err := cl.c.Read(ctx)
		if err != nil {
			f := frame{err: err, code: websocket.CloseStatus(err)}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				f.reason = ce.Reason
			}
			return f
		}
		if typ != websocket.MessageText {
			cl.t.Fatalf("received a binary frame")
		}
		sf, err := protocol.DecodeServerFrame(data)
		if err != nil {
			cl.t.Fatalf("DecodeServerFrame(%s) = %v", data, err)
		}
		if sf.Kind == protocol.FramePing {
			continue
		}
		return frame{ServerFrame: sf, raw: string(data), code: -1}
	}
}

// events reads envelopes until a terminal event, and returns them.
func (cl *client) untilTerminal() []frame {
	cl.t.Helper()
	var out []frame
	for {
		f := cl.next(20 * time.Second)
		if f.err != nil {
			cl.t.Fatalf("socket ended after %d frames before a terminal: %v", len(out), f.err)
		}
		out = append(out, f)
		if f.Type.Terminal() {
			return out
		}
	}
}

// untilClose reads envelopes until the socket closes, and returns them with the close.
func (cl *client) untilClose() ([]frame, frame) {
	cl.t.Helper()
	var out []frame
	for {
		f := cl.next(20 * time.Second)
		if f.err != nil {
			return out, f
		}
		out = append(out, f)
	}
}

// expectQuiet asserts that no frame but pings arrives for d.
func (cl *client) expectQuiet(d time.Duration) {
	cl.t.Helper()
	f := cl.next(d)
	if f.err == nil {
		cl.t.Fatalf("unexpected frame %s", f.raw)
	}
	if !errors.Is(f.err, context.DeadlineExceeded) {
		cl.t.Fatalf("socket ended: %v", f.err)
	}
	// Read's context expiry closed the socket; the caller is done with it.
}

// summary renders frames as event types, with the code of a RUN_ERROR and a bare marker.
func summary(frames []frame) string {
	var parts []string
	for _, f := range frames {
		s := string(f.Type)
		var ev struct {
			Name string `json:"name"`
			Code string `json:"code"`
		}
		json.Unmarshal(f.Event, &ev)
		switch f.Type {
		case "CUSTOM":
			s += ":" + ev.Name
		case "RUN_ERROR":
			s += ":" + ev.Code
		}
		if f.Kind == protocol.FrameEvent {
			s = "bare " + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// check asserts that frames are envelopes with distinct offsets.
func distinctOffsets(t testing.TB, frames []frame) {
	t.Helper()
	seen := map[string]bool{}
	for _, f := range frames {
		if f.Kind != protocol.FrameEnvelope {
			t.Errorf("frame %s is not an envelope", f.raw)
			continue
		}
		if seen[f.Offset] {
			t.Errorf("offset %s delivered twice", f.Offset)
		}
		seen[f.Offset] = true
	}
}

// raws returns the raw frames.
func raws(frames []frame) []string {
	out := make([]string, len(frames))
	for i, f := range frames {
		out[i] = f.raw
	}
	return out
}

// resume reads a whole resume socket: its envelopes and its close.
func (e *env) resume(t testing.TB, runID, offset string) ([]frame, frame) {
	t.Helper()
	return dial(t, e.url("runId", runID, "offset", offset), "").untilClose()
}

// waitClosed waits until runID's log is closed.
func (e *env) waitClosed(t testing.TB, runID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, closed, err := e.logs.Snapshot(context.Background(), "p1", runID); err == nil && closed {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("log of %s not closed after 60s", runID)
}

// tokenDeltas returns the expected event summary of a one-run turn with n deltas.
func tokenTurn(n int) string {
	s := "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START"
	for range n {
		s += " TEXT_MESSAGE_CONTENT"
	}
	return s + " TEXT_MESSAGE_END RUN_FINISHED"
}
