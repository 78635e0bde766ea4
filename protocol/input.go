package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidInput is wrapped by every *InputError.
var ErrInvalidInput = errors.New("protocol: invalid run input")

// InputError is a RunAgentInput that breaks the rules of PROTOCOL.md section 2.
// Its Error names the field: "messages[2].role: must be one of ...".
type InputError struct {
	Field   string // "messages[2].role"; "" for the input itself
	Message string
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

func (e *InputError) Unwrap() error { return ErrInvalidInput }

// RunAgentInput is a validated AG-UI run request. Optional fields that were
// absent or null are zero (nil for the raw ones); Tools and Context are never
// nil.
type RunAgentInput struct {
	ThreadID       string
	RunID          string
	ParentRunID    string
	Messages       []Message
	Tools          []Tool
	Context        []ContextEntry
	State          json.RawMessage // nil when absent or null
	ForwardedProps json.RawMessage // an object, nil when absent or null
	Resume         []ResumeEntry

	raw []byte
}

// Message is one entry of RunAgentInput.messages.
type Message struct {
	ID         string
	Role       string
	Content    json.RawMessage // as sent: a string, an array of parts, or nil
	ToolCallID string
	Raw        json.RawMessage // the whole message, unknown keys included
}

// Text returns the message's text: a string content, or its text parts joined.
func (m Message) Text() string {
	if isString(m.Content) {
		return unquote(m.Content)
	}
	if !isArray(m.Content) {
		return ""
	}
	var b strings.Builder
	for _, p := range splitArray(m.Content, nil) {
		if !isObject(p) {
			continue
		}
		ms := splitObject(p, nil)
		if unquote(lookup(ms, "type")) == "text" {
			b.WriteString(unquote(lookup(ms, "text")))
		}
	}
	return b.String()
}

// Tool is one entry of RunAgentInput.tools.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
	Raw         json.RawMessage
}

// ContextEntry is one entry of RunAgentInput.context.
type ContextEntry struct {
	Description string
	Value       string
}

// ResumeEntry is one entry of RunAgentInput.resume.
type ResumeEntry struct {
	InterruptID string
	Status      string // "resolved" or "cancelled"
	Payload     json.RawMessage
	Raw         json.RawMessage
}

var messageRoles = map[string]bool{
	"developer": true, "system": true, "assistant": true, "user": true,
	"tool": true, "activity": true, "reasoning": true,
}

// DecodeRunAgentInput decodes and validates a RunAgentInput. Input that is
// not JSON wraps ErrNotJSON; a rule violation is an *InputError.
func DecodeRunAgentInput(data []byte) (*RunAgentInput, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	return decodeInput(buf.Bytes())
}

func inputErr(field, msg string) error { return &InputError{Field: field, Message: msg} }

// present returns v unless it is absent or null.
func present(v []byte) []byte {
	if isNull(v) {
		return nil
	}
	return v
}

// decodeInput validates compact JSON it takes ownership of.
func decodeInput(raw []byte) (*RunAgentInput, error) {
	if !isObject(raw) {
		return nil, inputErr("", "run input must be a JSON object, not "+kindOf(raw))
	}
	ms := splitObject(raw, nil)
	in := &RunAgentInput{Tools: []Tool{}, Context: []ContextEntry{}}
	for _, f := range []struct {
		key string
		dst *string
	}{{"threadId", &in.ThreadID}, {"runId", &in.RunID}} {
		v := lookup(ms, f.key)
		if !isString(v) || unquote(v) == "" {
			return nil, inputErr(f.key, "required non-empty string")
		}
		*f.dst = unquote(v)
	}
	if !ValidRunID(in.RunID) {
		return nil, inputErr("runId", fmt.Sprintf("must be printable UTF-8 of at most %d bytes", MaxRunIDLen))
	}
	if v := present(lookup(ms, "parentRunId")); v != nil {
		if !isString(v) {
			return nil, inputErr("parentRunId", "must be a string")
		}
		in.ParentRunID = unquote(v)
	}
	msgs := lookup(ms, "messages")
	if !isArray(msgs) {
		return nil, inputErr("messages", "required array")
	}
	for i, m := range splitArray(msgs, nil) {
		at := fmt.Sprintf("messages[%d]", i)
		if !isObject(m) {
			return nil, inputErr(at, "must be an object")
		}
		mm := splitObject(m, nil)
		msg := Message{Raw: m, Content: present(lookup(mm, "content"))}
		if v := lookup(mm, "id"); isString(v) {
			msg.ID = unquote(v)
		} else {
			return nil, inputErr(at+".id", "required string")
		}
		msg.Role = unquote(lookup(mm, "role"))
		if !isString(lookup(mm, "role")) || !messageRoles[msg.Role] {
			return nil, inputErr(at+".role", "must be one of developer, system, assistant, user, tool, activity, reasoning")
		}
		if msg.Role == "tool" {
			v := lookup(mm, "toolCallId")
			if !isString(v) {
				return nil, inputErr(at+".toolCallId", "required string for a tool message")
			}
			msg.ToolCallID = unquote(v)
			if !isString(msg.Content) {
				return nil, inputErr(at+".content", "must be a string for a tool message")
			}
		}
		in.Messages = append(in.Messages, msg)
	}
	if v := present(lookup(ms, "tools")); v != nil {
		if !isArray(v) {
			return nil, inputErr("tools", "must be an array")
		}
		for i, t := range splitArray(v, nil) {
			at := fmt.Sprintf("tools[%d]", i)
			if !isObject(t) {
				return nil, inputErr(at, "must be an object")
			}
			tm := splitObject(t, nil)
			tool := Tool{Raw: t, Parameters: present(lookup(tm, "parameters"))}
			for _, f := range []struct {
				key string
				dst *string
			}{{"name", &tool.Name}, {"description", &tool.Description}} {
				v := lookup(tm, f.key)
				if !isString(v) {
					return nil, inputErr(at+"."+f.key, "required string")
				}
				*f.dst = unquote(v)
			}
			in.Tools = append(in.Tools, tool)
		}
	}
	if v := present(lookup(ms, "context")); v != nil {
		if !isArray(v) {
			return nil, inputErr("context", "must be an array")
		}
		for i, c := range splitArray(v, nil) {
			at := fmt.Sprintf("context[%d]", i)
			if !isObject(c) {
				return nil, inputErr(at, "must be an object")
			}
			cm := splitObject(c, nil)
			var ce ContextEntry
			for _, f := range []struct {
				key string
				dst *string
			}{{"description", &ce.Description}, {"value", &ce.Value}} {
				v := lookup(cm, f.key)
				if !isString(v) {
					return nil, inputErr(at+"."+f.key, "required string")
				}
				*f.dst = unquote(v)
			}
			in.Context = append(in.Context, ce)
		}
	}
	in.State = present(lookup(ms, "state"))
	if v := present(lookup(ms, "forwardedProps")); v != nil {
		if !isObject(v) {
			return nil, inputErr("forwardedProps", "must be an object")
		}
		in.ForwardedProps = v
	}
	if v := present(lookup(ms, "resume")); v != nil {
		if !isArray(v) {
			return nil, inputErr("resume", "must be an array")
		}
		for i, r := range splitArray(v, nil) {
			at := fmt.Sprintf("resume[%d]", i)
			if !isObject(r) {
				return nil, inputErr(at, "must be an object")
			}
			rm := splitObject(r, nil)
			re := ResumeEntry{Raw: r, Payload: present(lookup(rm, "payload"))}
			if v := lookup(rm, "interruptId"); isString(v) {
				re.InterruptID = unquote(v)
			} else {
				return nil, inputErr(at+".interruptId", "required string")
			}
			re.Status = unquote(lookup(rm, "status"))
			if s := lookup(rm, "status"); !isString(s) || (re.Status != "resolved" && re.Status != "cancelled") {
				return nil, inputErr(at+".status", `must be "resolved" or "cancelled"`)
			}
			in.Resume = append(in.Resume, re)
		}
	}
	in.raw = normalizedInput(ms)
	return in, nil
}

// normalizedInput re-encodes an input the way AG-UI 1.0.0 parses it: null
// optionals removed, tools and context defaulting to [].
func normalizedInput(ms []member) []byte {
	out := make([]member, 0, len(ms)+2)
	for _, m := range ms {
		if isNull(m.val) {
			switch m.key {
			case "state", "forwardedProps", "parentRunId", "tools", "context", "resume":
				continue
			}
		}
		out = append(out, m)
	}
	for _, k := range []string{"tools", "context"} {
		if lookup(out, k) == nil {
			out = append(out, member{key: k, val: []byte("[]")})
		}
	}
	return appendObject(nil, out)
}

// JSON returns the input as AG-UI 1.0.0 parses it (null optionals removed,
// tools and context defaulting to [], unknown keys kept). Do not modify it.
func (in *RunAgentInput) JSON() []byte { return in.raw }

// LastUserText returns the text of the last user message, "" when there is none.
func (in *RunAgentInput) LastUserText() string {
	for i := len(in.Messages) - 1; i >= 0; i-- {
		if in.Messages[i].Role == "user" {
			return in.Messages[i].Text()
		}
	}
	return ""
}

// ForwardedProp returns forwardedProps[key], nil when absent.
func (in *RunAgentInput) ForwardedProp(key string) json.RawMessage {
	if in.ForwardedProps == nil {
		return nil
	}
	return lookup(splitObject(in.ForwardedProps, nil), key)
}
