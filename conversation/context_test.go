package conversation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/agent/openai"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/protocol"
)

// chatModel is a loopback Chat Completions server that records the messages of every request
// it is sent and answers each with a streamed reply: "answer <n>" for the n-th request, or
// the tool call that toolCall names for a request whose last message is a user message with
// that text.
type chatModel struct {
	t        testing.TB
	srv      *httptest.Server
	toolCall map[string]string        // a user's text → the arguments of a get_weather call
	slow     map[string]time.Duration // a user's text → how long the answer to it waits

	mu       sync.Mutex
	requests [][]chatMsg
}

// chatMsg is a message of a Chat Completions request, as the API takes it.
type chatMsg struct {
	Role      string `json:"role"`
	Content   any    `json:"content"`
	ToolCalls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	ToolCallID string `json:"tool_call_id"`
}

func newChatModel(t testing.TB) *chatModel {
	m := &chatModel{t: t, toolCall: map[string]string{}, slow: map[string]time.Duration{}}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *chatModel) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []chatMsg `json:"messages"`
	}
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/chat/completions" || json.Unmarshal(body, &req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.requests = append(m.requests, req.Messages)
	n := len(m.requests)
	m.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c%d\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", n, delta, f)
	}
	last := req.Messages[len(req.Messages)-1]
	time.Sleep(m.slow[fmt.Sprint(last.Content)])
	if args, ok := m.toolCall[fmt.Sprint(last.Content)]; ok && last.Role == "user" {
		call, _ := json.Marshal(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": fmt.Sprintf("call_%d", n), "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": args}}}})
		chunk(string(call), "")
		chunk(`{}`, "tool_calls")
	} else {
		chunk(fmt.Sprintf(`{"role":"assistant","content":"answer %d"}`, n), "")
		chunk(`{}`, "stop")
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// agent returns an openai agent of the server.
func (m *chatModel) agent() *openai.Agent {
	a, err := openai.New(openai.Config{BaseURL: m.srv.URL + "/v1", Model: "m", Upstream: agent.Upstream{GapTimeout: 10 * time.Second}})
	if err != nil {
		m.t.Fatal(err)
	}
	return a
}

// request returns the messages of the n-th request (from 1), each as "role: content" with
// its tool calls and tool_call_id.
func (m *chatModel) request(n int) []string {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.requests) < n {
		m.t.Fatalf("the model received %d requests, not %d", len(m.requests), n)
	}
	var out []string
	for _, c := range m.requests[n-1] {
		s := c.Role + ": " + fmt.Sprint(c.Content)
		for _, tc := range c.ToolCalls {
			s += fmt.Sprintf(" [call %s %s %s %s]", tc.ID, tc.Type, tc.Function.Name, tc.Function.Arguments)
		}
		if c.ToolCallID != "" {
			s += " [for " + c.ToolCallID + "]"
		}
		out = append(out, s)
	}
	return out
}

// userFrame is a run frame of thread T posting only the messages given (id, role, content
// triples; a tool row's content is "<toolCallId>=<content>").
func userFrame(runID string, msgs ...string) []byte {
	ms := []any{}
	for i := 0; i+2 < len(msgs); i += 3 {
		m := map[string]any{"id": msgs[i], "role": msgs[i+1], "content": msgs[i+2]}
		if msgs[i+1] == "tool" {
			call, content, _ := strings.Cut(msgs[i+2], "=")
			m["toolCallId"], m["content"] = call, content
		}
		ms = append(ms, m)
	}
	b, _ := json.Marshal(map[string]any{"threadId": "T", "runId": runID, "messages": ms})
	return b
}

func sameMessages(t testing.TB, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s: the model received\n\t%s\nwant\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestAgentAnswersFromThread: runs that post only their new message give the model the whole
// thread, in order, each message once: on the gateway of the first turn, on a second gateway,
// for a server-started run, and for a run posting the whole transcript with the ids a
// hydrate gave (THREADS.md section 5).
func TestAgentAnswersFromThread(t *testing.T) {
	model := newChatModel(t)
	a := newEnv(t, envOptions{agent: model.agent()})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), agent: model.agent()})

	ca := dial(t, a.url(), "")
	ca.send(userFrame("r1", "u1", "user", "my name is Ada"))
	ca.untilTerminal()
	sameMessages(t, "turn 1", model.request(1), "user: my name is Ada")

	// The next frame leaves as soon as the reply's terminal arrived: the reply's thread may
	// not be finished yet.
	ca.send(userFrame("r2", "u2", "user", "what is my name?"))
	ca.untilTerminal()
	sameMessages(t, "turn 2, same gateway", model.request(2),
		"user: my name is Ada", "assistant: answer 1", "user: what is my name?")

	cb := dial(t, b.url(), "")
	cb.send(userFrame("r3", "u3", "user", "and on the other gateway?"))
	cb.untilTerminal()
	sameMessages(t, "turn 3, second gateway", model.request(3),
		"user: my name is Ada", "assistant: answer 1", "user: what is my name?", "assistant: answer 2",
		"user: and on the other gateway?")

	resp := b.httpDo(t, http.MethodPost, "/api/threads/T/runs", userFrame("r4", "u4", "user", "scheduled"), nil)
	if resp.StatusCode != http.StatusAccepted {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /api/threads/T/runs: %d %s", resp.StatusCode, body)
	}
	a.open(t, "/api/chat", http.MethodGet, nil, nil, "runId", "r4", "offset", "-1").all()
	sameMessages(t, "turn 4, server-started", model.request(4),
		"user: my name is Ada", "assistant: answer 1", "user: what is my name?", "assistant: answer 2",
		"user: and on the other gateway?", "assistant: answer 3", "user: scheduled")

	// The whole transcript as a hydrate gives it, then the new message.
	var posted []string
	for _, m := range a.hydrate(t, "/api/chat", "", "threadId", "T").Messages {
		posted = append(posted, m.ID, m.Role, m.Parts[0].Content)
	}
	if len(posted) != 8*3 {
		t.Fatalf("hydrate: %d messages, want 8", len(posted)/3)
	}
	posted = append(posted, "u5", "user", "all of it")
	ca.send(userFrame("r5", posted...))
	ca.untilTerminal()
	sameMessages(t, "turn 5, whole transcript posted", model.request(5),
		"user: my name is Ada", "assistant: answer 1", "user: what is my name?", "assistant: answer 2",
		"user: and on the other gateway?", "assistant: answer 3", "user: scheduled", "assistant: answer 4",
		"user: all of it")
}

// TestAgentHistoryClient: with AgentHistoryClient the model receives what the run posted,
// nothing more.
func TestAgentHistoryClient(t *testing.T) {
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: model.agent(), historyClient: true})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "u1", "user", "my name is Ada"))
	c.untilTerminal()
	c.send(userFrame("r2", "u2", "user", "what is my name?"))
	c.untilTerminal()
	sameMessages(t, "turn 2", model.request(2), "user: what is my name?")
}

// TestAgentToolCallsInContext: a tool call of the model and the client tool's result, posted
// alone by the next run, reach the model as Chat Completions requires: the assistant
// message with tool_calls, then a tool message with its tool_call_id.
func TestAgentToolCallsInContext(t *testing.T) {
	model := newChatModel(t)
	model.toolCall["weather in Paris?"] = `{"city":"Paris"}`
	e := newEnv(t, envOptions{agent: model.agent()})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "u1", "user", "weather in Paris?"))
	c.untilTerminal()
	c.send(userFrame("r2", "tool-call_1", "tool", "call_1=sunny, 21 °C"))
	c.untilTerminal()
	sameMessages(t, "the tool's result", model.request(2),
		"user: weather in Paris?",
		`assistant: <nil> [call call_1 function get_weather {"city":"Paris"}]`,
		"tool: sunny, 21 °C [for call_1]")
}

// approvalAgent answers a run with demo options (the demo agent's approval: a tool call and
// an interrupt) as the demo agent does, and every other run with the model.
type approvalAgent struct{ model *openai.Agent }

func (a approvalAgent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	if in.ForwardedProp("demo") != nil && len(in.Resume) == 0 {
		return demo.New().Run(ctx, in, emit)
	}
	return a.model.Run(ctx, in, emit)
}

// TestAgentContextAfterApproval: a continuation that posts nothing but the approval's answer
// gives the model the thread: the question, the reply that asked, its tool call and the
// answer as the client's own tool row.
func TestAgentContextAfterApproval(t *testing.T) {
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: approvalAgent{model.agent()}})
	c := dial(t, e.url(), "")
	c.send([]byte(`{"threadId":"T","runId":"r1","messages":[{"id":"u1","role":"user","content":"weather?"}],` +
		`"forwardedProps":{"demo":{"approval":true,"intervalMs":0}}}`))
	c.untilTerminal()
	c.send([]byte(`{"threadId":"T","runId":"r2","parentRunId":"r1","messages":[],` +
		`"resume":[{"interruptId":"r1.approval-call1.approval","status":"resolved","payload":{"approved":true}}]}`))
	c.untilTerminal()
	got := model.request(1)
	if len(got) != 3 || got[0] != "user: weather?" || !strings.HasPrefix(got[1], "assistant: ") ||
		!strings.Contains(got[1], "[call r1.approval-call1 function get_weather") ||
		got[2] != `tool: {"approved":true,"pendingExecution":true,"message":"User approved this action"} [for r1.approval-call1]` {
		t.Fatalf("the continuation's model request:\n\t%s", strings.Join(got, "\n\t"))
	}
}

// TestAgentHistoryWindow: a thread over AgentHistoryBytes reaches the model cut by the rule:
// its leading system message, then the newest messages that fit, the newest always.
func TestAgentHistoryWindow(t *testing.T) {
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: model.agent(), historyBytes: 1000})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "s1", "system", "be brief", "u1", "user", "first "+strings.Repeat("x", 1500)))
	c.untilTerminal()
	for i := 2; i <= 4; i++ {
		c.send(userFrame(fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i), "user", fmt.Sprintf("question %d", i)))
		c.untilTerminal()
	}
	// The first user message alone is over the budget: it is left out, every later one fits.
	sameMessages(t, "turn 4", model.request(4),
		"system: be brief", "assistant: answer 1", "user: question 2", "assistant: answer 2", "user: question 3",
		"assistant: answer 3", "user: question 4")
	// The newest message is given even over the budget.
	c.send(userFrame("r5", "u5", "user", "last "+strings.Repeat("y", 1500)))
	c.untilTerminal()
	sameMessages(t, "turn 5", model.request(5), "system: be brief", "user: last "+strings.Repeat("y", 1500))
}

// heldFinish holds the thread's finish of one run until release is closed.
type heldFinish struct {
	threads
	runID   string
	release chan struct{}
}

func (h heldFinish) FinishRun(ctx context.Context, principal, threadID, runID string, events []json.RawMessage) error {
	if runID == h.runID {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.threads.FinishRun(ctx, principal, threadID, runID, events)
}

// TestAgentContextBeforeFinishLands: the next run is accepted before the previous run's
// finish lands in the thread (a gateway slow to write it): the model still receives the
// previous reply, and once the finish lands the thread holds each reply right after its own
// question.
func TestAgentContextBeforeFinishLands(t *testing.T) {
	model := newChatModel(t)
	release := make(chan struct{})
	e := newEnv(t, envOptions{agent: model.agent(), wrapThreads: func(th conversation.Threads) conversation.Threads {
		return heldFinish{threads: th, runID: "r1", release: release}
	}})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "u1", "user", "my name is Ada"))
	c.untilTerminal()
	c.send(userFrame("r2", "u2", "user", "what is my name?"))
	c.untilTerminal()
	sameMessages(t, "turn 2", model.request(2), "user: my name is Ada", "assistant: answer 1", "user: what is my name?")
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := e.hydrate(t, "/api/chat", "", "threadId", "T")
		var got []string
		for _, m := range h.Messages {
			got = append(got, m.Role+": "+m.Parts[0].Content)
		}
		if h.ActiveRun == nil && len(got) == 4 {
			sameMessages(t, "the thread", got, "user: my name is Ada", "assistant: answer 1", "user: what is my name?", "assistant: answer 2")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thread after r1's finish: %v, active %+v", got, h.ActiveRun)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentContextEveryDoor: runs of one thread started by every door, each posting only its
// new message, give the model the whole thread.
func TestAgentContextEveryDoor(t *testing.T) {
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: model.agent()})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "u1", "user", "socket"))
	c.untilTerminal()
	want := []string{"user: socket"}
	for i, path := range []string{"/api/chat", "/api/chat/ndjson", "/agui"} {
		n := i + 2
		runID := fmt.Sprintf("r%d", n)
		e.open(t, path, http.MethodPost, userFrame(runID, "u"+runID, "user", path), http.Header{"X-Run-Id": {runID}}).all()
		want = append(want, fmt.Sprintf("assistant: answer %d", n-1), "user: "+path)
		sameMessages(t, path, model.request(n), want...)
	}
}

// blockingAgent streams a partial reply and waits for its end on a run that asks for it
// (forwardedProps.test.block), and answers every other run with the model.
type blockingAgent struct{ model *openai.Agent }

func (a blockingAgent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	if in.ForwardedProp("test") == nil {
		return a.model.Run(ctx, in, emit)
	}
	return testAgent{}.Run(ctx, in, emit)
}

// TestAgentContextWithoutStreamingRun: a run started beside an earlier run of its thread that
// still streams (multitaskStrategy concurrent) is answered without that run's unsettled reply.
func TestAgentContextWithoutStreamingRun(t *testing.T) {
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: blockingAgent{model.agent()}})
	c := dial(t, e.url(), "")
	c.send(threadFrame("T", "r1", script{Tokens: 2, Block: true}, "u1", "a long one"))
	for f := c.next(10 * time.Second); f.Type != "TEXT_MESSAGE_CONTENT"; f = c.next(10 * time.Second) {
		if f.err != nil {
			t.Fatal(f.err)
		}
	}
	c2 := dial(t, e.url(), "")
	c2.send(withStrategy(userFrame("r2", "u2", "user", "meanwhile"), conversation.MultitaskConcurrent))
	c2.untilTerminal()
	sameMessages(t, "turn 2", model.request(1), "user: a long one", "user: meanwhile")
	if code, body := e.abortHTTP(t, "r1", ""); code != http.StatusOK {
		t.Fatalf("abort r1: %d %s", code, body)
	}
}

// TestAgentHistoryCutStated: the cut of a thread's history is recorded on the turn's span:
// the messages and bytes given, and the messages left out.
func TestAgentHistoryCutStated(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	model := newChatModel(t)
	e := newEnv(t, envOptions{agent: model.agent(), historyBytes: 200, tracer: tp})
	c := dial(t, e.url(), "")
	c.send(userFrame("r1", "u1", "user", "first "+strings.Repeat("x", 300)))
	c.untilTerminal()
	c.send(userFrame("r2", "u2", "user", "second"))
	c.untilTerminal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range rec.Ended() {
			attrs := map[string]int64{}
			run := ""
			for _, kv := range s.Attributes() {
				switch kv.Key {
				case tracing.KeyRunID:
					run = kv.Value.AsString()
				case tracing.KeyHistoryMessages, tracing.KeyHistoryDropped, tracing.KeyHistoryBytes:
					attrs[string(kv.Key)] = kv.Value.AsInt64()
				}
			}
			if s.Name() != tracing.SpanTurn || run != "r2" {
				continue
			}
			// u1 (over 300 bytes) is left out; answer 1 and u2 fit in 200.
			if attrs[string(tracing.KeyHistoryMessages)] != 2 || attrs[string(tracing.KeyHistoryDropped)] != 1 ||
				attrs[string(tracing.KeyHistoryBytes)] <= 0 || attrs[string(tracing.KeyHistoryBytes)] > 200 {
				t.Fatalf("r2's turn span: %v, want 2 messages given, 1 dropped, at most 200 bytes", attrs)
			}
			sameMessages(t, "turn 2", model.request(2), "assistant: answer 1", "user: second")
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no ended turn span of r2")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
