package thread

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/wsgateway/wsgateway/internal/jsonenc"
	"github.com/wsgateway/wsgateway/protocol"
)

// This file computes what a run's agent is given as RunAgentInput.messages: the thread's
// transcript as of the run's acceptance, converted as @tanstack/ai 0.58.0 converts UIMessages
// to ModelMessages (uiMessageToModelMessages in dist/esm/activities/chat/messages.js), in
// AG-UI's wire form, and cut to a byte budget (THREADS.md section 5).

// Context returns the messages of the transcript as runID's acceptance left them, with the
// replies of the runs accepted before it (and the answers the run posted for their calls,
// Late): those up to the run's anchor, the whole transcript for a run without one. Runs
// accepted later added the others.
func (t *Transcript) Context(runID string) []Message {
	head, _ := t.split(runID)
	return head
}

// Clone returns a copy of t that Finish may change without changing t.
func (t Transcript) Clone() Transcript {
	c := t
	c.Messages = make([]Message, len(t.Messages))
	for i, m := range t.Messages {
		c.Messages[i] = m.clone()
	}
	c.Answered = cloneMap(t.Answered)
	c.Anchors = slices.Clone(t.Anchors)
	c.Late = slices.Clone(t.Late)
	return c
}

func cloneMap[V any](m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// wireOut is one AG-UI message of an agent's input.
type wireOut struct {
	ID         string          `json:"id"`
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCalls  []wireCallOut   `json:"toolCalls,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
}

// appendJSON appends w's JSON as json.Marshal writes it, and returns it with Content's bytes
// within it. Content (written by mustJSON) is compact and escaped already: json.Marshal would
// parse it again, and a turn converts every message of its window.
func (w wireOut) appendJSON(b []byte) (raw, content json.RawMessage) {
	b = append(b, `{"id":`...)
	b = jsonenc.String(b, w.ID)
	b = append(b, `,"role":`...)
	b = jsonenc.String(b, w.Role)
	at, end := 0, 0
	if len(w.Content) > 0 {
		b = append(b, `,"content":`...)
		at = len(b)
		b = append(b, w.Content...)
		end = len(b)
	}
	if len(w.ToolCalls) > 0 {
		b = append(b, `,"toolCalls":[`...)
		for i, c := range w.ToolCalls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = jsonenc.String(b, c.ID)
			b = append(b, `,"type":`...)
			b = jsonenc.String(b, c.Type)
			b = append(b, `,"function":{"name":`...)
			b = jsonenc.String(b, c.Function.Name)
			b = append(b, `,"arguments":`...)
			b = jsonenc.String(b, c.Function.Arguments)
			b = append(b, `}}`...)
		}
		b = append(b, ']')
	}
	if w.ToolCallID != "" {
		b = append(b, `,"toolCallId":`...)
		b = jsonenc.String(b, w.ToolCallID)
	}
	b = append(b, '}')
	if end > at {
		content = b[at:end:end]
	}
	return b, content
}

type wireCallOut struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// AgentMessages converts transcript messages to the AG-UI messages an agent is given, by the
// rules of @tanstack/ai's uiMessageToModelMessages:
//
//   - a system or user message: its text parts joined (a user message with media parts: its
//     parts, text parts as {"type":"text","text"} and the others as the client posted them);
//   - an assistant message: its parts in order, text and tool calls (those whose input is
//     complete, or that have an output) gathered into an assistant message, each tool-result
//     part closing it and following as a role "tool" message (toolCallId, its content); then
//     a "tool" message for each call that has an output but no tool-result part, or an
//     approval answered without output (the client's {"approved":…} row); thinking parts,
//     and media parts (AG-UI's assistant content is text, as in the client's wire), are left
//     out. A message without any of these is one assistant message without content.
//
// The first message made of an assistant message keeps its id, the next ones get "<id>-2",
// "<id>-3"…; a tool message's id is its tool-result part's, else "tool-<toolCallId>".
func AgentMessages(msgs []Message) []protocol.Message {
	var out []protocol.Message
	add := func(w wireOut) {
		raw, content := w.appendJSON(nil)
		out = append(out, protocol.Message{ID: w.ID, Role: w.Role, Content: content, ToolCallID: w.ToolCallID, Raw: raw})
	}
	for _, m := range msgs {
		switch m.Role {
		case "system":
			add(wireOut{ID: m.ID, Role: "system", Content: mustJSON(joinText(m.Parts))})
		case "user":
			add(wireOut{ID: m.ID, Role: "user", Content: userContent(m.Parts)})
		case "assistant":
			for _, w := range assistantMessages(m) {
				add(w)
			}
		}
	}
	return out
}

// joinText returns the text parts' contents joined.
func joinText(parts []Part) string {
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" && p.Raw == nil {
			b.WriteString(p.Content)
		}
	}
	return b.String()
}

// userContent returns a user message's content: its text, or, when it has parts that are
// not text (kept as the client posted them), all its parts.
func userContent(parts []Part) json.RawMessage {
	media := false
	for _, p := range parts {
		media = media || p.Raw != nil
	}
	if !media {
		return mustJSON(joinText(parts))
	}
	list := make([]json.RawMessage, 0, len(parts))
	for _, p := range parts {
		if p.Raw != nil {
			list = append(list, p.Raw)
		} else if p.Type == "text" {
			list = append(list, mustJSON(struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}{"text", p.Content}))
		}
	}
	return mustJSON(list)
}

// callIncluded is isToolCallIncluded: a call the model made, whose input is complete.
func callIncluded(p Part) bool {
	switch p.State {
	case "input-complete", "complete", "approval-requested", "approval-responded", "error":
		return true
	}
	return p.Output != nil
}

// assistantMessages is buildAssistantMessages.
func assistantMessages(m Message) []wireOut {
	var list []wireOut
	var text strings.Builder
	var calls []wireCallOut
	segments := 0
	flush := func(force bool) {
		if force || text.Len() > 0 || len(calls) > 0 {
			segments++
			w := wireOut{ID: m.ID, Role: "assistant", ToolCalls: calls}
			if segments > 1 {
				w.ID += "-" + strconv.Itoa(segments)
			}
			if text.Len() > 0 {
				w.Content = mustJSON(text.String())
			}
			list = append(list, w)
		}
		text.Reset()
		calls = nil
	}
	results := map[string]bool{}
	tool := func(partID, callID, content string) {
		if partID == "" {
			partID = "tool-" + callID
		}
		list = append(list, wireOut{ID: partID, Role: "tool", Content: mustJSON(content), ToolCallID: callID})
		results[callID] = true
	}
	for _, p := range m.Parts {
		switch {
		case p.Type == "text" && p.Raw == nil:
			text.WriteString(p.Content)
		case p.Type == "tool-call" && callIncluded(p):
			calls = append(calls, wireCallOut{ID: p.ID, Type: "function", Function: wireFunction{Name: p.Name, Arguments: p.Arguments}})
		case p.Type == "tool-result":
			flush(len(list) == 0)
			if (p.State == "complete" || p.State == "error") && !results[p.ToolCallID] {
				content := p.Content
				if p.ContentParts != nil {
					content = string(p.ContentParts)
				}
				tool(p.ID, p.ToolCallID, content)
			}
		}
	}
	flush(false)
	for _, p := range m.Parts {
		if p.Type != "tool-call" || results[p.ID] {
			continue
		}
		switch {
		case p.Output != nil:
			content := string(p.Output)
			if s, ok := asString(p.Output); ok {
				content = s
			}
			tool("", p.ID, content)
		case p.State == "approval-responded" && p.Approval != nil && p.Approval.Approved != nil:
			tool("", p.ID, approvalRow(*p.Approval.Approved))
		}
	}
	if len(list) == 0 {
		list = append(list, wireOut{ID: m.ID, Role: "assistant"})
	}
	return list
}

// approvalRow is the content of the tool message the client makes of an answered approval.
func approvalRow(approved bool) string {
	if approved {
		return `{"approved":true,"pendingExecution":true,"message":"User approved this action"}`
	}
	return `{"approved":false,"message":"User denied this action"}`
}

// Window is how AgentInput cut a context to its byte budget.
type Window struct {
	Messages int // the messages given to the agent
	Bytes    int // their bytes (of their JSON)
	Dropped  int // the messages left out
	// DroppedBytes are the bytes of the messages left out.
	DroppedBytes int
}

// AgentInput returns the messages a run's agent is given: msgs (the run's context, from
// AgentMessages) merged by id with posted, the messages the run posted, then cut to budget
// bytes of JSON (budget <= 0: no cut).
//
// A posted message is in the transcript already unless its role is one the transcript does
// not keep (developer, activity): such a message, with an id msgs does not have, is placed
// after the message it follows in posted if msgs has that one, else after the leading system
// and developer messages. Tool rows and reasoning are the transcript's own (from its parts).
//
// The cut keeps the leading system and developer messages, and the newest messages that fit
// in what the budget leaves, at least the newest one. A window never starts with a tool
// message (the API refuses a tool result without its call): tool messages at its start are
// left out, unless nothing else is left, when the call they answer comes with them.
func AgentInput(msgs, posted []protocol.Message, budget int) ([]protocol.Message, Window) {
	msgs = mergePosted(msgs, posted)
	lead := 0
	for lead < len(msgs) && isSystem(msgs[lead].Role) {
		lead++
	}
	size := func(from, to int) int {
		n := 0
		for _, m := range msgs[from:to] {
			n += len(m.Raw)
		}
		return n
	}
	start := lead
	if budget > 0 {
		start = len(msgs)
		for left := budget - size(0, lead); start > lead && len(msgs[start-1].Raw) <= left; start-- {
			left -= len(msgs[start-1].Raw)
		}
		if start == len(msgs) && start > lead {
			start-- // the newest message, whatever its size
		}
		for start < len(msgs) && msgs[start].Role == "tool" {
			start++
		}
		if start == len(msgs) && start > lead {
			for start > lead && msgs[start-1].Role == "tool" {
				start--
			}
			start = max(start-1, lead)
		}
	}
	w := Window{Dropped: start - lead, DroppedBytes: size(lead, start), Bytes: size(0, lead) + size(start, len(msgs))}
	out := append(msgs[:lead:lead], msgs[start:]...)
	w.Messages = len(out)
	return out, w
}

// mergePosted adds to msgs the posted messages of roles the transcript does not keep.
func mergePosted(msgs, posted []protocol.Message) []protocol.Message {
	ids := make(map[string]int, len(msgs))
	for i, m := range msgs {
		ids[m.ID] = i
	}
	after := map[int][]protocol.Message{} // by the index of the message of msgs they follow; -1: none
	at := -1
	for _, p := range posted {
		if i, ok := ids[p.ID]; ok {
			at = i
		} else if p.Role == "developer" || p.Role == "activity" {
			after[at] = append(after[at], p)
		}
	}
	if len(after) == 0 {
		return msgs
	}
	lead := 0
	for lead < len(msgs) && isSystem(msgs[lead].Role) {
		lead++
	}
	out := make([]protocol.Message, 0, len(msgs)+len(posted))
	for i := range msgs {
		if i == lead {
			out = append(out, after[-1]...)
		}
		out = append(out, msgs[i])
		out = append(out, after[i]...)
	}
	if lead == len(msgs) {
		out = append(out, after[-1]...)
	}
	return out
}

func isSystem(role string) bool { return role == "system" || role == "developer" }
