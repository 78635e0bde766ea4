package openai

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func decode(tb testing.TB, frame string) *protocol.RunAgentInput {
	tb.Helper()
	in, err := protocol.DecodeRunAgentInput([]byte(frame))
	if err != nil {
		tb.Fatalf("DecodeRunAgentInput(%s): %v", frame, err)
	}
	return in
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(tb testing.TB, a, b []byte) bool {
	tb.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		tb.Fatalf("not JSON: %s", a)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		tb.Fatalf("not JSON: %s", b)
	}
	return reflect.DeepEqual(va, vb)
}

func TestRequest(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		want  string
	}{
		{
			name:  "one user message",
			frame: `{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":"hi"}]}`,
			want:  `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		},
		{
			name: "a whole conversation",
			frame: `{"threadId":"t","runId":"r","messages":[
				{"id":"s","role":"system","content":"be brief"},
				{"id":"d","role":"developer","content":"use tools"},
				{"id":"u1","role":"user","content":"weather?","name":"ann"},
				{"id":"a1","role":"assistant","toolCalls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				{"id":"t1","role":"tool","toolCallId":"c1","content":"18C"},
				{"id":"rs","role":"reasoning","content":"thinking"},
				{"id":"ac","role":"activity","activityType":"x","content":{}},
				{"id":"a2","role":"assistant","content":"18C in Paris"},
				{"id":"u2","role":"user","content":[{"type":"text","text":"and this? "},{"type":"image","source":{"type":"url","value":"https://x/cat.png"}},{"type":"image","source":{"type":"data","value":"AAAA","mimeType":"image/png"}},{"type":"document","source":{"type":"url","value":"https://x/a.pdf"}}]},
				{"id":"u3","role":"user","content":[{"type":"text","text":"only "},{"type":"text","text":"text"}]}
			],
			"tools":[{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},{"name":"now","description":"The time"}],
			"context":[{"description":"user locale","value":"fr-FR"},{"description":"plan","value":"pro"}]}`,
			want: `{"model":"m","messages":[
				{"role":"system","content":"Context:\n- user locale: fr-FR\n- plan: pro"},
				{"role":"system","content":"be brief"},
				{"role":"system","content":"use tools"},
				{"role":"user","content":"weather?","name":"ann"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				{"role":"tool","content":"18C","tool_call_id":"c1"},
				{"role":"assistant","content":"18C in Paris"},
				{"role":"user","content":[{"type":"text","text":"and this? "},{"type":"image_url","image_url":{"url":"https://x/cat.png"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},
				{"role":"user","content":"only text"}
			],
			"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
				{"type":"function","function":{"name":"now","description":"The time","parameters":{"type":"object","properties":{}}}}],
			"stream":true,"stream_options":{"include_usage":true}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Request("m", decode(t, tt.frame))
			if err != nil || !sameJSON(t, got, []byte(tt.want)) {
				t.Errorf("Request = %s, %v\nwant %s", got, err, tt.want)
			}
		})
	}
}

const frame = `{"threadId":"th","runId":"r1","messages":[{"id":"u1","role":"user","content":"hi"}]}`

// stream starts a loopback Chat Completions server answering every request with the given
// server-sent event data lines ("" sends nothing more), after checking the request.
func stream(tb testing.TB, datas ...string) (*httptest.Server, *string) {
	tb.Helper()
	var reqErr string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		want, _ := Request("m", decode(tb, frame))
		switch {
		case r.URL.Path != "/v1/chat/completions":
			reqErr = "path " + r.URL.Path
		case string(body) != string(want):
			reqErr = "body " + string(body)
		case r.Header.Get("Authorization") != "Bearer sk-test-key":
			reqErr = "Authorization " + r.Header.Get("Authorization")
		case r.Header.Get("Accept") != "text/event-stream":
			reqErr = "Accept " + r.Header.Get("Accept")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, d := range datas {
			io.WriteString(w, "data: "+d+"\n\n")
		}
	}))
	tb.Cleanup(srv.Close)
	return srv, &reqErr
}

func newAgent(tb testing.TB, base string) *Agent {
	tb.Helper()
	a, err := New(Config{BaseURL: base + "/v1/", Model: "m", APIKey: "sk-test-key", Upstream: agent.Upstream{GapTimeout: 5 * time.Second}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(a.up.CloseIdleConnections)
	return a
}

// run runs the agent against datas and returns its events, checked by the protocol pipeline
// as the turn checks them, and its error.
func run(tb testing.TB, datas ...string) ([]string, error) {
	tb.Helper()
	srv, reqErr := stream(tb, datas...)
	pipe := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: true})
	var got []string
	err := newAgent(tb, srv.URL).Run(context.Background(), decode(tb, frame), func(ev []byte) error {
		got = append(got, string(ev))
		if _, err := pipe.Push(ev); err != nil {
			tb.Errorf("the pipeline refuses %s: %v", ev, err)
		}
		return nil
	})
	if *reqErr != "" {
		tb.Errorf("request: %s", *reqErr)
	}
	return got, err
}

func sseChunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m-2024","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
}

const (
	runStarted = `{"type":"RUN_STARTED","threadId":"th","runId":"r1"}`
	usageChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m-2024","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":5}}}`
)

func TestRunConverts(t *testing.T) {
	tests := []struct {
		name   string
		datas  []string
		events []string
	}{
		{
			name: "text with usage (OpenAI)",
			datas: []string{
				sseChunk(`{"role":"assistant","content":"","refusal":null}`, ""),
				sseChunk(`{"content":"Hel"}`, ""),
				sseChunk(`{"content":"lo"}`, ""),
				sseChunk(`{}`, "stop"),
				usageChunk,
				"[DONE]",
			},
			events: []string{
				runStarted,
				`{"type":"TEXT_MESSAGE_START","messageId":"r1.msg1","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.msg1","delta":"Hel"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.msg1","delta":"lo"}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"r1.msg1"}`,
				`{"type":"RUN_FINISHED","threadId":"th","runId":"r1","result":{"finishReason":"stop"},"usage":[{"model":"m-2024","inputTokens":9,"outputTokens":12,"totalTokens":21,"reasoningTokens":5,"cachedInputTokens":0}]}`,
			},
		},
		{
			name: "reasoning, text, then two parallel tool calls (vLLM)",
			datas: []string{
				sseChunk(`{"role":"assistant","reasoning_content":"Think"}`, ""),
				sseChunk(`{"reasoning_content":"ing."}`, ""),
				sseChunk(`{"content":"Let me check."}`, ""),
				sseChunk(`{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""),
				sseChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}`, ""),
				sseChunk(`{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]}`, ""),
				sseChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, ""),
				sseChunk(`{}`, "tool_calls"),
				"[DONE]",
			},
			events: []string{
				runStarted,
				`{"type":"REASONING_START","messageId":"r1.reasoning1"}`,
				`{"type":"REASONING_MESSAGE_START","messageId":"r1.thought1","role":"reasoning"}`,
				`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":"Think"}`,
				`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":"ing."}`,
				`{"type":"REASONING_MESSAGE_END","messageId":"r1.thought1"}`,
				`{"type":"REASONING_END","messageId":"r1.reasoning1"}`,
				`{"type":"TEXT_MESSAGE_START","messageId":"r1.msg1","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.msg1","delta":"Let me check."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"r1.msg1"}`,
				`{"type":"TOOL_CALL_START","toolCallId":"call_a","toolCallName":"get_weather","parentMessageId":"r1.msg1"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"call_a","delta":"{\"city\":"}`,
				`{"type":"TOOL_CALL_START","toolCallId":"call_b","toolCallName":"get_time","parentMessageId":"r1.msg1"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"call_b","delta":"{}"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"call_a","delta":"\"Paris\"}"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"call_a"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"call_b"}`,
				`{"type":"RUN_FINISHED","threadId":"th","runId":"r1","result":{"finishReason":"tool_calls"}}`,
			},
		},
		{
			name: "reasoning field, whole tool call without index or id (Ollama)",
			datas: []string{
				sseChunk(`{"role":"assistant","content":"","reasoning":"Hmm"}`, ""),
				sseChunk(`{"role":"assistant","content":"","tool_calls":[{"id":"call_x","function":{"name":"now","arguments":"{}"}},{"function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]}`, ""),
				sseChunk(`{"role":"assistant","content":""}`, "tool_calls"),
				"[DONE]",
			},
			events: []string{
				runStarted,
				`{"type":"REASONING_START","messageId":"r1.reasoning1"}`,
				`{"type":"REASONING_MESSAGE_START","messageId":"r1.thought1","role":"reasoning"}`,
				`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":"Hmm"}`,
				`{"type":"REASONING_MESSAGE_END","messageId":"r1.thought1"}`,
				`{"type":"REASONING_END","messageId":"r1.reasoning1"}`,
				`{"type":"TOOL_CALL_START","toolCallId":"call_x","toolCallName":"now"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"call_x","delta":"{}"}`,
				`{"type":"TOOL_CALL_START","toolCallId":"r1.call1","toolCallName":"get_weather"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.call1","delta":"{\"city\":\"Oslo\"}"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"call_x"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"r1.call1"}`,
				`{"type":"RUN_FINISHED","threadId":"th","runId":"r1","result":{"finishReason":"tool_calls"}}`,
			},
		},
		{
			name: "no [DONE] after a finish (llama.cpp variants)",
			datas: []string{
				sseChunk(`{"content":"ok"}`, ""),
				sseChunk(`{}`, "length"),
			},
			events: []string{
				runStarted,
				`{"type":"TEXT_MESSAGE_START","messageId":"r1.msg1","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.msg1","delta":"ok"}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"r1.msg1"}`,
				`{"type":"RUN_FINISHED","threadId":"th","runId":"r1","result":{"finishReason":"length"}}`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := run(t, tt.datas...)
			if err != nil {
				t.Errorf("Run error: %v", err)
			}
			if len(got) != len(tt.events) {
				t.Fatalf("Run emitted\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.events, "\n"))
			}
			for i := range got {
				if !sameJSON(t, []byte(got[i]), []byte(tt.events[i])) {
					t.Errorf("event %d = %s, want %s", i, got[i], tt.events[i])
				}
			}
		})
	}
}

func TestRunFailures(t *testing.T) {
	tests := []struct {
		name   string
		datas  []string
		want   string
		events int
	}{
		{
			name:   "provider error in the stream",
			datas:  []string{sseChunk(`{"content":"a"}`, ""), `{"error":{"message":"The server had an error while processing your request.","type":"server_error","code":null}}`},
			want:   "openai agent: the provider reported an error: The server had an error while processing your request. (server_error)",
			events: 3,
		},
		{
			name:   "cut short",
			datas:  []string{sseChunk(`{"content":"a"}`, "")},
			want:   "openai agent: the upstream stream ended before [DONE]",
			events: 3,
		},
		{
			name:   "malformed chunk",
			datas:  []string{`not json at all`},
			want:   "openai agent: the upstream sent a chunk that is not a chat completion chunk: not json at all",
			events: 1,
		},
		{
			name: "two tool calls with one id",
			datas: []string{
				sseChunk(`{"tool_calls":[{"index":0,"id":"dup","function":{"name":"a","arguments":"{}"}}]}`, ""),
				sseChunk(`{"tool_calls":[{"index":1,"id":"dup","function":{"name":"b","arguments":"{}"}}]}`, ""),
			},
			want:   "openai agent: the upstream sent a second tool call with the id: dup",
			events: 3,
		},
		{
			name:   "tool call never named",
			datas:  []string{sseChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`, "tool_calls"), "[DONE]"},
			want:   "openai agent: the upstream sent a tool call without a name (index 0)",
			events: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := run(t, tt.datas...)
			if err == nil || err.Error() != tt.want || len(got) != tt.events {
				t.Errorf("Run = %d events, %v\nwant %d events, %q", len(got), err, tt.events, tt.want)
			}
		})
	}
}

// TestRunKeyNeverInErrors: a server that echoes the key in its error gets it redacted.
func TestRunKeyNeverInErrors(t *testing.T) {
	for _, h := range []http.HandlerFunc{
		func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":{"message":"Incorrect API key provided: sk-test-key."}}`, http.StatusUnauthorized)
		},
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"error":{"message":"bad key sk-test-key"}}`+"\n\n")
		},
		func(w http.ResponseWriter, r *http.Request) {
			// The key straddles the end of the part of the body that is read.
			http.Error(w, strings.Repeat("x", 195)+"sk-test-key", http.StatusUnauthorized)
		},
	} {
		srv := httptest.NewServer(h)
		err := newAgent(t, srv.URL).Run(context.Background(), decode(t, frame), func([]byte) error { return nil })
		srv.Close()
		if err == nil || strings.Contains(err.Error(), "sk-t") || !strings.Contains(err.Error(), "[reda") {
			t.Errorf("Run = %v, want an error with the key redacted", err)
		}
	}
}

// TestRedactCutKey: a key cut short at the end of what was read is redacted too.
func TestRedactCutKey(t *testing.T) {
	a := &Agent{key: "sk-0123456789abcdef"}
	tests := []struct{ in, want string }{
		{"key sk-0123456789abcdef here", "key [redacted] here"},
		{"cut sk-0123456", "cut [redacted]"},
		{"cut sk-0", "cut [redacted]"},
		{"no key sk-", "no key sk-"},
		{"other sk-0123X", "other sk-0123X"},
	}
	for _, tt := range tests {
		if got := a.redact(tt.in); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestRunHeaders: static and forwarded headers reach the server; the key wins over both.
func TestRunHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: "+sseChunk(`{}`, "stop")+"\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	a, err := New(Config{BaseURL: srv.URL + "/v1/chat/completions", Model: "m", APIKey: "sk-k",
		Upstream: agent.Upstream{Header: http.Header{"X-Tenant": {"t1"}}, ForwardHeaders: []string{"x-user", "authorization"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.up.CloseIdleConnections()
	ctx := agent.WithClientHeader(context.Background(), http.Header{"X-User": {"u"}, "Authorization": {"Bearer client"}})
	if err := a.Run(ctx, decode(t, frame), func([]byte) error { return nil }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	h := <-got
	if h.Get("X-Tenant") != "t1" || h.Get("X-User") != "u" || h.Get("Authorization") != "Bearer sk-k" {
		t.Errorf("request headers %v: want X-Tenant t1, X-User u, Authorization Bearer sk-k", h)
	}
}

// TestRunAbort: cancelling the context cancels the request; Run returns the context's error
// and emits nothing more.
func TestRunAbort(t *testing.T) {
	cancelled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: "+sseChunk(`{"content":"a"}`, "")+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := newAgent(t, srv.URL).Run(ctx, decode(t, frame), func(ev []byte) error {
		n++
		if strings.Contains(string(ev), "TEXT_MESSAGE_CONTENT") {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 3 {
		t.Errorf("Run after cancel = %v after %d events, want context.Canceled after 3", err, n)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
}

func TestNewErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Model: "m"},
		{BaseURL: "api.openai.com/v1", Model: "m"},
		{BaseURL: "https://api.openai.com/v1"},
		{BaseURL: "https://api.openai.com/v1", Model: "m", Upstream: agent.Upstream{TurnTimeout: -1}},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}
