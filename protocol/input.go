package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	// MultitaskStrategy is the run's rule for a thread that has another run active
	// (THREADS.md section 6): one of MultitaskStrategies, "" when absent.
	MultitaskStrategy string

	raw []byte
}

// Message is one entry of RunAgentInput.messages.
type Message struct {
	ID         string
	Role       string
	Content    json.RawMessage // as sent (checked only on a tool message, where it is a string); nil when absent or null
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

var (
	messageRoles = map[string]bool{
		"developer": true, "system": true, "assistant": true, "user": true,
		"tool": true, "activity": true, "reasoning": true,
	}
	resumeStatuses = map[string]bool{"resolved": true, "cancelled": true}
)

// MultitaskStrategies are the values of a run's multitaskStrategy.
var MultitaskStrategies = []string{"enqueue", "reject", "interrupt", "rollback", "concurrent"}

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

// decodeInput validates compact JSON it takes ownership of and reports the
// first broken rule.
func decodeInput(raw []byte) (*RunAgentInput, error) {
	if !isObject(raw) {
		return nil, inputErr("", "run input must be a JSON object, not "+kindOf(raw))
	}
	ms := splitObject(raw, nil)
	in := &RunAgentInput{Tools: []Tool{}, Context: []ContextEntry{}}
	if err := in.decodeIDs(ms); err != nil {
		return nil, err
	}
	msgs := lookup(ms, "messages")
	if !isArray(msgs) {
		return nil, inputErr("messages", "required array")
	}
	var err error
	if in.Messages, err = appendEntries(in.Messages, "messages", msgs, decodeMessage); err != nil {
		return nil, err
	}
	if in.Tools, err = appendOptional(in.Tools, ms, "tools", decodeTool); err != nil {
		return nil, err
	}
	if in.Context, err = appendOptional(in.Context, ms, "context", decodeContext); err != nil {
		return nil, err
	}
	in.State = present(lookup(ms, "state"))
	if v := present(lookup(ms, "forwardedProps")); v != nil {
		if !isObject(v) {
			return nil, inputErr("forwardedProps", "must be an object")
		}
		in.ForwardedProps = v
	}
	if in.Resume, err = appendOptional(in.Resume, ms, "resume", decodeResume); err != nil {
		return nil, err
	}
	if v := present(lookup(ms, "multitaskStrategy")); v != nil {
		if in.MultitaskStrategy = unquote(v); !isString(v) || !slices.Contains(MultitaskStrategies, in.MultitaskStrategy) {
			return nil, inputErr("multitaskStrategy", "must be one of "+strings.Join(MultitaskStrategies, ", "))
		}
	}
	in.raw = normalizedInput(ms)
	return in, nil
}

// decodeIDs reads threadId, runId and parentRunId. A runId names the run's
// log, so it must be one ValidRunID accepts.
func (in *RunAgentInput) decodeIDs(ms []member) error {
	for _, f := range []struct {
		key string
		dst *string
	}{{"threadId", &in.ThreadID}, {"runId", &in.RunID}} {
		v := lookup(ms, f.key)
		if !isString(v) || unquote(v) == "" {
			return inputErr(f.key, "required non-empty string")
		}
		*f.dst = unquote(v)
	}
	if !ValidRunID(in.RunID) {
		return inputErr("runId", fmt.Sprintf("must be printable UTF-8 of at most %d bytes", MaxRunIDLen))
	}
	if v := present(lookup(ms, "parentRunId")); v != nil {
		if !isString(v) {
			return inputErr("parentRunId", "must be a string")
		}
		in.ParentRunID = unquote(v)
	}
	return nil
}

// appendOptional is appendEntries for an array that may be absent or null.
func appendOptional[T any](dst []T, ms []member, key string, decode func(at string, raw []byte, ms []member) (T, error)) ([]T, error) {
	v := present(lookup(ms, key))
	if v == nil {
		return dst, nil
	}
	if !isArray(v) {
		return nil, inputErr(key, "must be an array")
	}
	return appendEntries(dst, key, v, decode)
}

// appendEntries decodes the entries of the array field key, each an object,
// and appends them to dst. decode gets the entry's path for its errors
// ("messages[2]"), its encoding and its members.
func appendEntries[T any](dst []T, key string, arr []byte, decode func(at string, raw []byte, ms []member) (T, error)) ([]T, error) {
	for i, raw := range splitArray(arr, nil) {
		at := fmt.Sprintf("%s[%d]", key, i)
		if !isObject(raw) {
			return nil, inputErr(at, "must be an object")
		}
		entry, err := decode(at, raw, splitObject(raw, nil))
		if err != nil {
			return nil, err
		}
		dst = append(dst, entry)
	}
	return dst, nil
}

// requiredStrings reads the string members keys of the entry at path at
// into dst, in order, and reports the first that is not a string.
func requiredStrings(at string, ms []member, keys []string, dst ...*string) error {
	for i, key := range keys {
		v := lookup(ms, key)
		if !isString(v) {
			return inputErr(at+"."+key, "required string")
		}
		*dst[i] = unquote(v)
	}
	return nil
}

// oneOf returns the string member key of the entry at path at, which must be
// one of allowed; msg says which values are.
func oneOf(at string, ms []member, key string, allowed map[string]bool, msg string) (string, error) {
	v := lookup(ms, key)
	s := unquote(v)
	if !isString(v) || !allowed[s] {
		return "", inputErr(at+"."+key, msg)
	}
	return s, nil
}

// decodeMessage decodes one message. A tool message answers a tool call, so
// it names the call and its content is the result's text.
func decodeMessage(at string, raw []byte, ms []member) (Message, error) {
	msg := Message{Raw: raw, Content: present(lookup(ms, "content"))}
	if err := requiredStrings(at, ms, []string{"id"}, &msg.ID); err != nil {
		return Message{}, err
	}
	var err error
	if msg.Role, err = oneOf(at, ms, "role", messageRoles, "must be one of developer, system, assistant, user, tool, activity, reasoning"); err != nil {
		return Message{}, err
	}
	if msg.Role != "tool" {
		return msg, nil
	}
	v := lookup(ms, "toolCallId")
	if !isString(v) {
		return Message{}, inputErr(at+".toolCallId", "required string for a tool message")
	}
	msg.ToolCallID = unquote(v)
	if !isString(msg.Content) {
		return Message{}, inputErr(at+".content", "must be a string for a tool message")
	}
	return msg, nil
}

// decodeTool decodes one tool; its parameters are kept as sent.
func decodeTool(at string, raw []byte, ms []member) (Tool, error) {
	tool := Tool{Raw: raw, Parameters: present(lookup(ms, "parameters"))}
	err := requiredStrings(at, ms, []string{"name", "description"}, &tool.Name, &tool.Description)
	return tool, err
}

// decodeContext decodes one context entry.
func decodeContext(at string, _ []byte, ms []member) (ContextEntry, error) {
	var ce ContextEntry
	err := requiredStrings(at, ms, []string{"description", "value"}, &ce.Description, &ce.Value)
	return ce, err
}

// decodeResume decodes one resume entry, which resolves or cancels an interrupt.
func decodeResume(at string, raw []byte, ms []member) (ResumeEntry, error) {
	re := ResumeEntry{Raw: raw, Payload: present(lookup(ms, "payload"))}
	if err := requiredStrings(at, ms, []string{"interruptId"}, &re.InterruptID); err != nil {
		return ResumeEntry{}, err
	}
	var err error
	re.Status, err = oneOf(at, ms, "status", resumeStatuses, `must be "resolved" or "cancelled"`)
	return re, err
}

// normalizedInput re-encodes an input the way AG-UI 1.0.0 parses it: null
// optionals removed, tools and context defaulting to [].
func normalizedInput(ms []member) []byte {
	out := make([]member, 0, len(ms)+2)
	for _, m := range ms {
		if isNull(m.val) {
			switch m.key {
			case "state", "forwardedProps", "parentRunId", "tools", "context", "resume", "multitaskStrategy":
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

// WithMessages returns a copy of in whose messages are msgs (each with its Raw encoding, as
// DecodeRunAgentInput gives them), in its fields and in its JSON.
func (in *RunAgentInput) WithMessages(msgs []Message) *RunAgentInput {
	c := *in
	c.Messages = msgs
	n := 2
	for _, m := range msgs {
		n += len(m.Raw) + 1
	}
	arr := make([]byte, 0, n)
	arr = append(arr, '[')
	for i, m := range msgs {
		if i > 0 {
			arr = append(arr, ',')
		}
		arr = append(arr, m.Raw...)
	}
	arr = append(arr, ']')
	ms := splitObject(in.raw, nil)
	for i := range ms {
		if ms[i].key == "messages" {
			ms[i].val = arr
		}
	}
	c.raw = appendObject(nil, ms)
	return &c
}
