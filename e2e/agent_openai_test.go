package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestOpenAIAgent runs turns through a gateway whose agent is an OpenAI-compatible server (a
// Go httptest server streaming chat.completion.chunk events as OpenAI does): the client
// receives the answer as AG-UI events (reasoning, text, a tool call, RUN_FINISHED with the
// usage), and a provider error as RUN_ERROR with the provider's message.
func TestOpenAIAgent(t *testing.T) {
	requests := make(chan map[string]any, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request to "+r.URL.Path, http.StatusBadRequest)
			return
		}
		io.Copy(io.Discard, r.Body)
		requests <- req
		w.Header().Set("Content-Type", "text/event-stream")
		msgs, _ := req["messages"].([]any)
		last, _ := msgs[len(msgs)-1].(map[string]any)
		if last["content"] == "fail" {
			io.WriteString(w, `data: {"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`+"\n\n")
			return
		}
		for _, d := range []string{
			`{"role":"assistant","content":"","reasoning_content":"Weather "}`,
			`{"reasoning_content":"question."}`,
			`{"content":"Checking"}`,
			`{"content":" now."}`,
			`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`,
			`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]}`,
		} {
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"test-model","choices":[{"index":0,"delta":`+d+`,"finish_reason":null}]}`+"\n\n")
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"test-model","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"test-model","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	gw := startGateway(t, "--agent", "openai", "--agent-url", up.URL+"/v1", "--agent-model", "test-model")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, gw.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()

	if err := c.Write(ctx, websocket.MessageText, aguiRunFrame("openai-1", "Weather in Paris?", `{}`)); err != nil {
		t.Fatal(err)
	}
	got := readUntilTerminal(t, ctx, c)
	var want []map[string]any
	for _, e := range []string{
		`{"type":"CUSTOM","name":"run.accepted","value":{}}`,
		`{"type":"RUN_STARTED","threadId":"th-agent","runId":"openai-1"}`,
		`{"type":"REASONING_START","messageId":"openai-1.reasoning1"}`,
		`{"type":"REASONING_MESSAGE_START","messageId":"openai-1.thought1","role":"reasoning"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"openai-1.thought1","delta":"Weather "}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"openai-1.thought1","delta":"question."}`,
		`{"type":"REASONING_MESSAGE_END","messageId":"openai-1.thought1"}`,
		`{"type":"REASONING_END","messageId":"openai-1.reasoning1"}`,
		`{"type":"TEXT_MESSAGE_START","messageId":"openai-1.msg1","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"openai-1.msg1","delta":"Checking"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"openai-1.msg1","delta":" now."}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"openai-1.msg1"}`,
		`{"type":"TOOL_CALL_START","toolCallId":"call_1","toolCallName":"get_weather","parentMessageId":"openai-1.msg1"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"call_1","delta":"{\"city\":\"Paris\"}"}`,
		`{"type":"TOOL_CALL_END","toolCallId":"call_1"}`,
		`{"type":"RUN_FINISHED","threadId":"th-agent","runId":"openai-1","result":{"finishReason":"tool_calls"},"usage":[{"model":"test-model","inputTokens":20,"outputTokens":7,"totalTokens":27}]}`,
	} {
		var m map[string]any
		if err := json.Unmarshal([]byte(e), &m); err != nil {
			t.Fatal(err)
		}
		want = append(want, m)
	}
	sameEventList(t, "openai turn", got, want)
	req := <-requests
	if req["model"] != "test-model" || req["stream"] != true {
		t.Errorf("upstream request %v: want model test-model, stream true", req)
	}

	if err := c.Write(ctx, websocket.MessageText, aguiRunFrame("openai-2", "fail", `{}`)); err != nil {
		t.Fatal(err)
	}
	got = readUntilTerminal(t, ctx, c)
	last := got[len(got)-1]
	wantMsg := "openai agent: the provider reported an error: Rate limit reached for requests (requests, rate_limit_exceeded)"
	if eventTypes(got) != "CUSTOM RUN_STARTED RUN_ERROR" || last["message"] != wantMsg || last["code"] != "agent_error" {
		t.Errorf("failing turn: %s ending %v; want CUSTOM RUN_STARTED RUN_ERROR{%q, agent_error}", eventTypes(got), last, wantMsg)
	}
}

// TestOpenAIAgentContinuedOnTakeover: two gateways with --agent openai --takeover continue;
// the one streaming a reply is killed (kill -9) midway. The other takes the run over: it asks
// the Chat Completions server again with the reply stored so far as the last assistant
// message (the server answers with the rest of its reply, as a model continuing would), and
// appends only that. The client, resuming on the survivor by its last offset, assembles one
// run with one message whose text is the whole reply, each part once, then RUN_FINISHED; the
// log verifies.
func TestOpenAIAgentContinuedOnTakeover(t *testing.T) {
	var tokens []string
	for i := 1; i <= 40; i++ {
		tokens = append(tokens, fmt.Sprintf("w%d ", i))
	}
	continued := make(chan string, 4) // the assistant content of each continuation request
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		if json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		from := 0
		if last := req.Messages[len(req.Messages)-1]; last.Role == "assistant" {
			continued <- last.Content
			for from < len(tokens) && strings.HasPrefix(last.Content, strings.Join(tokens[:from+1], "")) {
				from++
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range tokens[from:] {
			d, _ := json.Marshal(map[string]string{"content": tok})
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"test-model","choices":[{"index":0,"delta":`+string(d)+`,"finish_reason":null}]}`+"\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"test-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	args := []string{"--agent", "openai", "--agent-url", up.URL + "/v1", "--agent-model", "test-model", "--takeover", "continue", "--lease-ttl", "2s"}
	survivor := startGateway(t, args...) // holds NATS
	doomed := startGateway(t, append(args, "--nats-url", survivor.NATSURL)...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	c, err := dialWS(ctx, doomed.WS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, aguiRunFrame("cont-1", "hi", `{}`)); err != nil {
		t.Fatal(err)
	}
	f := &follower{runID: "cont-1"}
	if err := f.read(ctx, c, contentCount(5)); err != nil {
		t.Fatal(err)
	}
	doomed.signal(t, syscall.SIGKILL)
	doomed.wait(t, 10*time.Second)
	f.resume(t, ctx, survivor)

	var text strings.Builder
	count := map[string]int{}
	for i, e := range f.got {
		if i > 0 && e.ID <= f.got[i-1].ID {
			t.Errorf("offset %d %q does not follow %q", i, e.ID, f.got[i-1].ID)
		}
		count[e.Type]++
		if e.Type == "TEXT_MESSAGE_CONTENT" {
			text.WriteString(e.Delta)
		}
	}
	if want := strings.Join(tokens, ""); text.String() != want {
		t.Errorf("the client assembled the text %q, want %q", text.String(), want)
	}
	for typ, want := range map[string]int{"RUN_STARTED": 1, "TEXT_MESSAGE_START": 1, "TEXT_MESSAGE_END": 1, "RUN_FINISHED": 1, "RUN_ERROR": 0} {
		if count[typ] != want {
			t.Errorf("the client got %d %s, want %d (all: %v)", count[typ], typ, want, count)
		}
	}
	if last := f.got[len(f.got)-1]; last.Type != "RUN_FINISHED" {
		t.Errorf("the run ends %s %s, want RUN_FINISHED", last.Type, last.Code)
	}
	select {
	case prefix := <-continued:
		if !strings.HasPrefix(strings.Join(tokens, ""), prefix) || len(prefix) < len(strings.Join(tokens[:5], "")) {
			t.Errorf("the continuation was asked with the assistant content %q, want the stored reply (at least the 5 parts the client had)", prefix)
		}
	default:
		t.Error("the survivor never asked the server to continue the reply")
	}
	verifyLog(t, chunksOf(t, ctx, survivor, "cont-1"))
}
