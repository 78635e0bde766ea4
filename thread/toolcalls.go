package thread

import (
	"encoding/json"

	"github.com/wsgateway/wsgateway/internal/jsoncompact"
)

// The builder's tool calls: their start, arguments and end, their results and outputs.

type toolCallPart struct {
	id, name, arguments, state string
	input, metadata            json.RawMessage
}

// updateToolCallPart replaces the call's part (keeping its approval, output,
// and input and metadata unless given) or appends one.
func (b *builder) updateToolCallPart(id string, tc toolCallPart) {
	b.each(id, func(m *Message) {
		at := -1
		for i := range m.Parts {
			if m.Parts[i].Type == "tool-call" && m.Parts[i].ID == tc.id {
				at = i
				break
			}
		}
		p := Part{Type: "tool-call", ID: tc.id, Name: tc.name, Arguments: tc.arguments, State: tc.state}
		p.Metadata, p.Input = tc.metadata, tc.input
		if at >= 0 {
			old := m.Parts[at]
			if nullish(p.Metadata) {
				p.Metadata = old.Metadata
			}
			if nullish(p.Input) {
				p.Input = old.Input
			}
			if old.Approval != nil {
				a := *old.Approval
				p.Approval = &a
			}
			p.Output = old.Output
			m.Parts[at] = p
			return
		}
		if nullish(p.Metadata) {
			p.Metadata = nil
		}
		if nullish(p.Input) {
			p.Input = nil
		}
		m.Parts = append(m.Parts, p)
	})
}

func (b *builder) toolCallStart(e *event) {
	target := opt{}
	if v, ok := e.get("parentMessageId"); ok && !nullish(v) {
		target.s, target.ok = asString(v)
	} else {
		target = b.activeAssistantID()
	}
	id, st := b.ensureAssistantMessage(target)
	st.hasToolCallsSinceTextStr = true
	callID, _ := e.str("toolCallId")
	if st.toolCalls[callID] != nil {
		return
	}
	name, _ := e.str("toolCallName")
	md := keep(e.raw("metadata"))
	st.toolCalls[callID] = &toolCall{id: callID, name: name, state: "awaiting-input", metadata: md}
	st.toolCallOrder = append(st.toolCallOrder, callID)
	b.toolCallToMessage[callID] = id
	b.updateToolCallPart(id, toolCallPart{id: callID, name: name, state: "awaiting-input", metadata: md})
}

// openToolCall returns the message and the state of the tool call e names, nil when unknown.
func (b *builder) openToolCall(e *event) (string, *toolCall) {
	callID, _ := e.str("toolCallId")
	id := b.toolCallToMessage[callID]
	if id == "" {
		return "", nil
	}
	st := b.state(id)
	if st == nil {
		return "", nil
	}
	return id, st.toolCalls[callID]
}

func (b *builder) toolCallArgs(e *event) {
	id, tc := b.openToolCall(e)
	if tc == nil {
		return
	}
	delta, _ := e.str("delta")
	tc.arguments += delta
	if tc.state == "awaiting-input" && delta != "" {
		tc.state = "input-streaming"
	}
	b.updateToolCallPart(id, toolCallPart{id: tc.id, name: tc.name, arguments: tc.arguments, state: tc.state})
}

func (b *builder) toolCallEnd(e *event) {
	id, tc := b.openToolCall(e)
	if tc == nil || tc.state == "input-complete" {
		return
	}
	input, hasInput := e.get("input")
	input = keep(input)
	if hasInput && tc.arguments == "" {
		tc.arguments = jsStringify(input)
	}
	b.completeToolCall(id, tc)
	if hasInput {
		b.updateToolCallPart(id, toolCallPart{id: tc.id, name: tc.name, arguments: tc.arguments, state: "input-complete", input: input, metadata: tc.metadata})
	}
}

// jsStringify is JSON.stringify of a parsed value, for the values agents send
// (compact JSON).
func jsStringify(v json.RawMessage) string {
	if c, ok := jsoncompact.Append(nil, v); ok {
		return string(c)
	}
	return string(v)
}

// parseJSON is JSON.parse: the value, or nil when s is not JSON.
func parseJSON(s string) json.RawMessage {
	c, ok := jsoncompact.Append(nil, []byte(s))
	if !ok {
		return nil
	}
	return c
}

func (b *builder) completeToolCall(id string, tc *toolCall) {
	tc.state = "input-complete"
	parsed := parseJSON(tc.arguments)
	if b.callPartIn(tc.id, "error") || b.callPartIn(tc.id, "approval-requested", "approval-responded") {
		return
	}
	b.updateToolCallPart(id, toolCallPart{id: tc.id, name: tc.name, arguments: tc.arguments, state: "input-complete", input: parsed, metadata: tc.metadata})
}

// callPartIn reports whether any message has a part of the call in one of states.
func (b *builder) callPartIn(callID string, states ...string) bool {
	for _, m := range b.msgs {
		for _, p := range m.Parts {
			if p.Type == "tool-call" && p.ID == callID {
				for _, s := range states {
					if p.State == s {
						return true
					}
				}
			}
		}
	}
	return false
}

func (b *builder) completeAllToolCallsForMessage(id string) {
	st := b.state(id)
	if st == nil {
		return
	}
	for _, callID := range st.toolCallOrder {
		if tc := st.toolCalls[callID]; tc.state != "input-complete" {
			b.completeToolCall(id, tc)
		}
	}
}

func (b *builder) completeAllToolCalls() {
	for _, id := range append([]string(nil), b.activeMessageIDs...) {
		b.completeAllToolCallsForMessage(id)
	}
}

// messageWithCall returns the id of the first message with a part of the call.
func (b *builder) messageWithCall(callID string, role string) opt {
	for _, m := range b.msgs {
		if role != "" && m.Role != role {
			continue
		}
		for _, p := range m.Parts {
			if p.Type == "tool-call" && p.ID == callID {
				return some(m.ID)
			}
		}
	}
	return opt{}
}

func (b *builder) toolCallResult(e *event) {
	callID, _ := e.str("toolCallId")
	id, ok := b.toolCallToMessage[callID]
	if !ok {
		o := b.messageWithCall(callID, "")
		id = o.s
	}
	if id == "" {
		return
	}
	st, _ := e.str("state")
	isErr := st == "output-error"
	if !isErr {
		ts, _ := asString(e.tanstack("state"))
		isErr = ts == "output-error"
	}
	content := keep(e.raw("content"))
	var output json.RawMessage
	if s, ok := asString(content); ok {
		if output = parseJSON(s); output == nil {
			output = content
		}
	} else if string(content) != "" {
		// JSON.parse of a non-string (an array of parts) throws: the value itself.
		output = content
	}
	b.addToolOutput(callID, output, isErr, "")
	state, errText := "complete", ""
	if isErr {
		state, errText = "error", toolResultError(output)
	}
	b.updateToolResultPart(id, callID, content, state, errText)
}

// addToolOutput is updateToolCallWithOutput: every message's first part of
// the call gets the output and a state.
func (b *builder) addToolOutput(callID string, output json.RawMessage, isErr bool, errText string) {
	for i := range b.msgs {
		m := &b.msgs[i]
		for j := range m.Parts {
			p := &m.Parts[j]
			if p.Type != "tool-call" || p.ID != callID {
				continue
			}
			p.Raw = nil
			p.Output = output
			if errText != "" {
				p.Output = mustJSON(map[string]string{"error": errText})
			}
			p.State = "complete"
			if isErr || errText != "" {
				p.State = "error"
			}
			break
		}
	}
}

func toolResultError(output json.RawMessage) string {
	if isObject(output) {
		if s, ok := asString(object(output)["error"]); ok {
			return s
		}
	}
	if s, ok := asString(output); ok {
		return s
	}
	return "Tool execution failed"
}

// updateToolResultPart replaces the call's tool-result part or appends one.
// content is the raw content (a string, or an array of parts).
func (b *builder) updateToolResultPart(id, callID string, content json.RawMessage, state, errText string) {
	p := Part{Type: "tool-result", ToolCallID: callID, State: state, Error: errText}
	if s, ok := asString(content); ok {
		p.Content = s
	} else {
		p.ContentParts = content
	}
	b.each(id, func(m *Message) {
		for i := range m.Parts {
			if m.Parts[i].Type == "tool-result" && m.Parts[i].ToolCallID == callID {
				m.Parts[i] = p
				return
			}
		}
		m.Parts = append(m.Parts, p)
	})
}
