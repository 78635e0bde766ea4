package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
