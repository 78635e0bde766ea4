package thread_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
)

// TestContextAsAccepted: a run's context is the transcript as its acceptance left it, with
// the replies of earlier runs, without what later runs added.
func TestContextAsAccepted(t *testing.T) {
	var tr thread.Transcript
	for _, r := range []struct{ run, msg string }{{"r1", `{"id":"u1","role":"user","content":"one"}`},
		{"r2", `{"id":"u2","role":"user","content":"two"}`}, {"r3", `{"id":"u3","role":"user","content":"three"}`}} {
		if err := tr.Accept(r.run, input(t, r.run, "", r.msg)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Finish("r1", reply("r1", "a1", "reply one")); err != nil {
		t.Fatal(err)
	}
	if got, want := summaryOf(tr.Context("r2")), "u1:one a1:reply one u2:two"; got != want {
		t.Fatalf("r2's context: %s, want %s", got, want)
	}

	// A run that posts no message (a continuation) accepted before the previous run's finish
	// landed: its context and its reply follow that run's reply.
	var cont thread.Transcript
	if err := cont.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"one"}`)); err != nil {
		t.Fatal(err)
	}
	if err := cont.Accept("r2", input(t, "r2", "")); err != nil {
		t.Fatal(err)
	}
	if err := cont.Finish("r1", reply("r1", "a1", "reply one")); err != nil {
		t.Fatal(err)
	}
	if got, want := summaryOf(cont.Context("r2")), "u1:one a1:reply one"; got != want {
		t.Fatalf("the continuation's context: %s, want %s", got, want)
	}
	if err := cont.Finish("r2", reply("r2", "a2", "reply two")); err != nil {
		t.Fatal(err)
	}
	if got, want := summaryOf(cont.Messages), "u1:one a1:reply one a2:reply two"; got != want {
		t.Fatalf("after the continuation: %s, want %s", got, want)
	}
}

// uiMessages decodes a transcript's messages.
func uiMessages(t *testing.T, s string) []thread.Message {
	t.Helper()
	var msgs []thread.Message
	if err := json.Unmarshal([]byte(s), &msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func raws(msgs []protocol.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.Write(m.Raw)
		b.WriteString("\n")
	}
	return b.String()
}

// TestAgentMessages: transcript messages reach the agent as @tanstack/ai converts UIMessages
// to ModelMessages: text joined, thinking left out, tool calls on the assistant message, each
// tool result a tool message right after the calls before it, the rest of the reply after.
func TestAgentMessages(t *testing.T) {
	msgs := uiMessages(t, `[
{"id":"s1","role":"system","parts":[{"type":"text","content":"be "},{"type":"text","content":"brief"}]},
{"id":"u1","role":"user","parts":[{"type":"text","content":"what is this?"},{"type":"image","source":{"type":"url","value":"https://example.com/a.png"}}]},
{"id":"a1","role":"assistant","parts":[{"type":"thinking","content":"hmm"},{"type":"text","content":"Let me check."},
 {"type":"tool-call","id":"c1","name":"lookup","arguments":"{\"q\":\"a\"}","state":"complete","output":{"found":true}},
 {"type":"tool-result","toolCallId":"c1","content":"{\"found\":true}","state":"complete"},
 {"type":"text","content":"Found it."}]},
{"id":"u2","role":"user","parts":[{"type":"text","content":"and the weather?"}]},
{"id":"a2","role":"assistant","parts":[{"type":"tool-call","id":"c2","name":"get_weather","arguments":"{}","state":"approval-responded",
 "approval":{"id":"i2","needsApproval":true,"approved":false}},
 {"type":"tool-call","id":"c3","name":"clock","arguments":"{}","state":"complete","output":"noon"},
 {"type":"tool-call","id":"c4","name":"late","arguments":"{\"a","state":"input-streaming"}]},
{"id":"a3","role":"assistant","parts":[]}]`)
	want := `{"id":"s1","role":"system","content":"be brief"}
{"id":"u1","role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image","source":{"type":"url","value":"https://example.com/a.png"}}]}
{"id":"a1","role":"assistant","content":"Let me check.","toolCalls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"a\"}"}}]}
{"id":"tool-c1","role":"tool","content":"{\"found\":true}","toolCallId":"c1"}
{"id":"a1-2","role":"assistant","content":"Found it."}
{"id":"u2","role":"user","content":"and the weather?"}
{"id":"a2","role":"assistant","toolCalls":[{"id":"c2","type":"function","function":{"name":"get_weather","arguments":"{}"}},{"id":"c3","type":"function","function":{"name":"clock","arguments":"{}"}}]}
{"id":"tool-c2","role":"tool","content":"{\"approved\":false,\"message\":\"User denied this action\"}","toolCallId":"c2"}
{"id":"tool-c3","role":"tool","content":"noon","toolCallId":"c3"}
{"id":"a3","role":"assistant"}
`
	got := thread.AgentMessages(msgs)
	if raws(got) != want {
		t.Fatalf("AgentMessages:\n%s\nwant\n%s", raws(got), want)
	}
	// Content is the content of Raw.
	for _, m := range got {
		var w struct {
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m.Raw, &w); err != nil || string(w.Content) != string(m.Content) {
			t.Fatalf("%s: Content %s, in Raw %s (%v)", m.ID, m.Content, w.Content, err)
		}
	}
	// Text that encoding/json escapes is escaped as it would escape it.
	odd := "<a href=\"x\">&</a> \u2028 \x7f é \\ \t"
	tricky := thread.AgentMessages([]thread.Message{{ID: "u<3>", Role: "user", Parts: []thread.Part{{Type: "text", Content: odd}}},
		{ID: "a&", Role: "assistant", Parts: []thread.Part{{Type: "text", Content: odd}, {Type: "tool-call", ID: "c<1>", Name: "f&", Arguments: odd, State: "complete"},
			{Type: "tool-result", ToolCallID: "c<1>", Content: odd, State: "complete"}}}})
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	type wire struct {
		ID         string `json:"id"`
		Role       string `json:"role"`
		Content    string `json:"content,omitempty"`
		ToolCalls  []call `json:"toolCalls,omitempty"`
		ToolCallID string `json:"toolCallId,omitempty"`
	}
	c := call{ID: "c<1>", Type: "function"}
	c.Function.Name, c.Function.Arguments = "f&", odd
	for i, w := range []wire{{ID: "u<3>", Role: "user", Content: odd}, {ID: "a&", Role: "assistant", Content: odd, ToolCalls: []call{c}},
		{ID: "tool-c<1>", Role: "tool", Content: odd, ToolCallID: "c<1>"}} {
		if b, _ := json.Marshal(w); i >= len(tricky) || string(tricky[i].Raw) != string(b) {
			t.Fatalf("AgentMessages of text to escape, message %d:\n%s\nwant\n%s", i, raws(tricky), b)
		}
	}
	// Every message is one a run frame may carry.
	in := []byte(`{"threadId":"t","runId":"r","messages":[` + strings.Join(strings.Split(strings.TrimSpace(want), "\n"), ",") + `]}`)
	if _, err := protocol.DecodeRunAgentInput(in); err != nil {
		t.Fatalf("the agent's messages are not a valid input: %v", err)
	}
}

// msg is an agent message of the given role whose JSON is size bytes long.
func msg(id, role string, size int) protocol.Message {
	raw := `{"id":"` + id + `","role":"` + role + `","content":""}`
	pad := strings.Repeat("x", size-len(raw))
	return protocol.Message{ID: id, Role: role, Raw: json.RawMessage(`{"id":"` + id + `","role":"` + role + `","content":"` + pad + `"}`)}
}

func idsOf(msgs []protocol.Message) string {
	var s []string
	for _, m := range msgs {
		s = append(s, m.ID)
	}
	return strings.Join(s, " ")
}

// TestAgentInputWindow: the window rule keeps the leading system and developer messages and
// the newest messages that fit, the newest always, never starting with a tool message; the
// developer messages a run posts join the transcript's in place.
func TestAgentInputWindow(t *testing.T) {
	thread5 := []protocol.Message{msg("s1", "system", 100), msg("u1", "user", 100), msg("a1", "assistant", 100),
		msg("t1", "tool", 100), msg("a1-2", "assistant", 100), msg("u2", "user", 100)}
	for _, tc := range []struct {
		name    string
		msgs    []protocol.Message
		posted  []protocol.Message
		budget  int
		want    string
		dropped int
	}{
		{"no budget", thread5, nil, 0, "s1 u1 a1 t1 a1-2 u2", 0},
		{"everything fits", thread5, nil, 600, "s1 u1 a1 t1 a1-2 u2", 0},
		{"the oldest go", thread5, nil, 350, "s1 a1-2 u2", 3},
		{"never a tool message first", thread5, nil, 450, "s1 a1-2 u2", 3},
		{"the newest over the budget", thread5, nil, 150, "s1 u2", 4},
		{"tool messages only: their call with them", []protocol.Message{msg("u1", "user", 100), msg("a1", "assistant", 100),
			msg("t1", "tool", 100), msg("t2", "tool", 100)}, nil, 150, "a1 t1 t2", 1},
		{"posted developer messages", thread5[1:],
			[]protocol.Message{msg("d0", "developer", 50), msg("u1", "user", 100), msg("d1", "developer", 50), msg("x", "tool", 50)}, 0,
			"d0 u1 d1 a1 t1 a1-2 u2", 0},
		{"a posted developer message leads", thread5,
			[]protocol.Message{msg("d0", "developer", 50), msg("u2", "user", 100)}, 300, "s1 d0 u2", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, w := thread.AgentInput(append([]protocol.Message(nil), tc.msgs...), tc.posted, tc.budget)
			if idsOf(got) != tc.want || w.Dropped != tc.dropped || w.Messages != len(got) {
				t.Fatalf("AgentInput = %s (%+v), want %s with %d dropped", idsOf(got), w, tc.want, tc.dropped)
			}
		})
	}
}

// BenchmarkAgentInput computes the agent's messages of the next run of a thread of 300 turns
// (a question and a reply of 7 KB each, about 2 MiB of messages), as a run's start does: the
// whole transcript converted, then cut to the default budget (512 KiB) and to none.
//
//	go test -run '^$' -bench AgentInput ./thread/
func BenchmarkAgentInput(b *testing.B) {
	var tr thread.Transcript
	reply := strings.Repeat("some words of a reply ", 320)
	for i := range 300 {
		id := strconv.Itoa(i)
		tr.Messages = append(tr.Messages,
			thread.Message{ID: "u" + id, Role: "user", Parts: []thread.Part{{Type: "text", Content: "question " + id}}},
			thread.Message{ID: "a" + id, Role: "assistant", Parts: []thread.Part{{Type: "text", Content: reply}}})
	}
	posted := []protocol.Message{{ID: "u299", Role: "user"}}
	for _, budget := range []int{512 << 10, 0} {
		b.Run("budget="+strconv.Itoa(budget), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if msgs, _ := thread.AgentInput(thread.AgentMessages(tr.Context("r")), posted, budget); len(msgs) == 0 {
					b.Fatal("no messages")
				}
			}
		})
	}
}

// modelShape is what a model is given of a message, to compare AgentMessages with the
// client's own convertMessagesToModelMessages: ids (the client repeats a message's id on
// each of its segments) and thinking (the gateway leaves it out) aside.
func modelShape(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var msgs []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"toolCallId"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"toolCalls"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, m := range msgs {
		content := sameForm(m.Role, m.Content)
		b.WriteString(m.Role + " " + content)
		for _, c := range m.ToolCalls {
			b.WriteString(" [" + c.ID + " " + c.Function.Name + " " + c.Function.Arguments + "]")
		}
		if m.ToolCallID != "" {
			b.WriteString(" for " + m.ToolCallID)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// sameForm returns a content in one form for both sides: "" for none; an assistant
// message's text only; AG-UI's text parts
// ({"type":"text","text"}) as the client's ({"type":"text","content"}); a tool message's
// parts, which AG-UI carries as a JSON string, as parts; keys sorted.
func sameForm(role string, raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil || v == nil || v == "" {
		return ""
	}
	if s, ok := v.(string); ok && role == "tool" {
		var parts []any
		if json.Unmarshal([]byte(s), &parts) == nil {
			v = parts
		}
	}
	if parts, ok := v.([]any); ok && role == "assistant" {
		// AG-UI's assistant content is text: the client's wire, and the agent's messages,
		// leave out an assistant message's media parts.
		var text strings.Builder
		for _, p := range parts {
			if o, ok := p.(map[string]any); ok && o["type"] == "text" {
				text.WriteString(fmt.Sprint(o["content"]))
			}
		}
		if v = text.String(); v == "" {
			return ""
		}
	}
	if parts, ok := v.([]any); ok {
		for _, p := range parts {
			if o, ok := p.(map[string]any); ok && o["type"] == "text" {
				if text, ok := o["text"]; ok {
					delete(o, "text")
					o["content"] = text
				}
			}
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestAgentMessagesDifferential: the agent's messages of transcripts built from generated
// runs are what the client's convertMessagesToModelMessages makes of the client's own
// messages (up to ids and thinking).
func TestAgentMessagesDifferential(t *testing.T) {
	all := generatedLogs().logs
	var logs [][]json.RawMessage
	for i := 0; i < len(all) && len(logs) < 1500; i += 2 {
		logs = append(logs, all[i])
	}
	threads := threeRunThreads(logs)
	results := runReference(t, threads)
	bad := 0
	for i, th := range threads {
		tr := build(t, th, results[i].Inputs)
		// The client leaves system messages out of its model messages (it sends the system
		// prompts apart); the agent, like the client's wire, has them.
		var kept []string
		for _, m := range thread.AgentMessages(tr.Messages) {
			if m.Role != "system" {
				kept = append(kept, string(m.Raw))
			}
		}
		got := modelShape(t, json.RawMessage("["+strings.Join(kept, ",")+"]"))
		if want := modelShape(t, results[i].Model); got != want {
			if bad++; bad <= 3 {
				t.Errorf("%s: the agent's messages\n%s\nthe client's model messages\n%s", th.ID, got, want)
			}
		}
	}
	t.Logf("%d/%d threads of three generated runs give the client's model messages", len(threads)-bad, len(threads))
}
