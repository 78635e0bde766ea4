package aguihttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const frame = `{"threadId":"th","runId":"r1","messages":[{"id":"u1","role":"user","content":"hi"}],"forwardedProps":{"k":1}}`

func input(tb testing.TB) *protocol.RunAgentInput {
	tb.Helper()
	in, err := protocol.DecodeRunAgentInput([]byte(frame))
	if err != nil {
		tb.Fatal(err)
	}
	return in
}

// upstream starts a loopback AG-UI server: h runs after the request body was read into body.
func upstream(tb testing.TB, h func(w http.ResponseWriter, r *http.Request, body []byte)) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h(w, r, body)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

func newAgent(tb testing.TB, cfg Config) *Agent {
	tb.Helper()
	a, err := New(cfg)
	if err != nil {
		tb.Fatalf("New(%+v): %v", cfg, err)
	}
	tb.Cleanup(a.up.CloseIdleConnections)
	return a
}

// run runs a and returns the events it emitted and its error.
func run(ctx context.Context, a *Agent, in *protocol.RunAgentInput) ([]string, error) {
	var got []string
	err := a.Run(ctx, in, func(ev []byte) error {
		got = append(got, string(ev))
		return nil
	})
	return got, err
}

// TestRunRelays checks the request (method, body, headers) and that every event of the stream
// is emitted as sent, whatever the framing of the server-sent events.
func TestRunRelays(t *testing.T) {
	in := input(t)
	var reqErr string
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		checks := []struct{ what, got, want string }{
			{"method", r.Method, http.MethodPost},
			{"path", r.URL.Path, "/agent"},
			{"body", string(body), string(in.JSON())},
			{"Content-Type", r.Header.Get("Content-Type"), "application/json"},
			{"Accept", r.Header.Get("Accept"), "text/event-stream"},
			{"static header", r.Header.Get("X-Api-Key"), "static"},
			{"forwarded header", r.Header.Get("X-User"), "alice"},
			{"forwarded header the static one overrides", r.Header.Get("X-Api-Key"), "static"},
			{"header not forwarded", r.Header.Get("Cookie"), ""},
		}
		for _, c := range checks {
			if c.got != c.want {
				reqErr += c.what + " = " + c.got + ", want " + c.want + "; "
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": hello\n\n")
		io.WriteString(w, `data: {"type":"RUN_STARTED","threadId":"th","runId":"r1"}`+"\r\n\r\n")
		io.WriteString(w, "data: {\"type\":\"TEXT_MESSAGE_CHUNK\",\ndata: \"messageId\":\"m\",\"delta\":\"a\"}\n\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, `data: {"type":"RUN_FI`)
		w.(http.Flusher).Flush()
		io.WriteString(w, `NISHED","threadId":"th","runId":"r1"}`+"\n\n")
	})
	a := newAgent(t, Config{
		URL: srv.URL + "/agent",
		Upstream: agent.Upstream{
			Header:         http.Header{"X-Api-Key": {"static"}},
			ForwardHeaders: []string{"x-user", "x-api-key"},
		},
	})
	ctx := agent.WithClientHeader(context.Background(), http.Header{
		"X-User": {"alice"}, "X-Api-Key": {"from-client"}, "Cookie": {"c=1"},
	})
	got, err := run(ctx, a, in)
	if reqErr != "" {
		t.Errorf("request: %s", reqErr)
	}
	want := []string{
		`{"type":"RUN_STARTED","threadId":"th","runId":"r1"}`,
		"{\"type\":\"TEXT_MESSAGE_CHUNK\",\n\"messageId\":\"m\",\"delta\":\"a\"}",
		`{"type":"RUN_FINISHED","threadId":"th","runId":"r1"}`,
	}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Run = %q, %v\nwant %q, nil", got, err, want)
	}
}

func TestRunFailures(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		handler func(w http.ResponseWriter, r *http.Request, body []byte)
		want    string // the error's text
		events  int    // emitted before the failure
	}{
		{
			name: "status",
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, "agent crashed", http.StatusBadGateway)
			},
			want: "agui agent: the upstream answered 502 Bad Gateway: agent crashed",
		},
		{
			name: "not JSON",
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"th\",\"runId\":\"r1\"}\n\ndata: {\"type\": oops\n\n")
			},
			want:   `agui agent: the upstream sent an event that is not a JSON object: {"type": oops`,
			events: 1,
		},
		{
			name: "a JSON array",
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: [1,2]\n\n")
			},
			want: "agui agent: the upstream sent an event that is not a JSON object: [1,2]",
		},
		{
			name: "oversized",
			cfg:  Config{Upstream: agent.Upstream{MaxEventBytes: 64}},
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, `data: {"type":"CUSTOM","name":"x","value":"`+strings.Repeat("v", 100)+`"}`+"\n\n")
			},
			want: "agui agent: an upstream event is too large: more than 64 bytes",
		},
		{
			name: "stalled",
			cfg:  Config{Upstream: agent.Upstream{GapTimeout: 200 * time.Millisecond}},
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"th\",\"runId\":\"r1\"}\n\n")
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			want:   "agui agent: the upstream stream stalled: nothing received for 200ms",
			events: 1,
		},
		{
			name: "no first event",
			cfg:  Config{Upstream: agent.Upstream{FirstEventTimeout: 200 * time.Millisecond}},
			handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
				<-r.Context().Done()
			},
			want: "agui agent: no event from the upstream within 200ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, tt.handler)
			tt.cfg.URL = srv.URL
			got, err := run(context.Background(), newAgent(t, tt.cfg), input(t))
			if err == nil || err.Error() != tt.want || len(got) != tt.events {
				t.Errorf("Run = %d events, %v\nwant %d events, %q", len(got), err, tt.events, tt.want)
			}
		})
	}
}

// TestRunEmitError: the agent stops at the first refused event and returns the refusal.
func TestRunEmitError(t *testing.T) {
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"a\":1}\n\ndata: {\"a\":2}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	refused := errors.New("refused")
	n := 0
	err := newAgent(t, Config{URL: srv.URL}).Run(context.Background(), input(t), func([]byte) error {
		n++
		return refused
	})
	if !errors.Is(err, refused) || n != 1 {
		t.Errorf("Run = %v after %d events, want refused after 1", err, n)
	}
}

// TestRunAbort: cancelling the context cancels the upstream request, and Run returns the
// context's error.
func TestRunAbort(t *testing.T) {
	cancelled := make(chan struct{})
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"th\",\"runId\":\"r1\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	})
	ctx, cancel := context.WithCancel(context.Background())
	err := newAgent(t, Config{URL: srv.URL}).Run(ctx, input(t), func([]byte) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel = %v, want context.Canceled", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
}

func TestNewErrors(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{URL: "127.0.0.1:8000/agent"},
		{URL: "ftp://host/agent"},
		{URL: "http://host/agent", Upstream: agent.Upstream{GapTimeout: -time.Second}},
		{URL: "http://host/agent", Upstream: agent.Upstream{MaxEventBytes: -1}},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}
