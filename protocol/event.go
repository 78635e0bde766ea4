package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
)

// EventType is the wire value of an AG-UI event's "type". The zero value is
// not a valid type.
type EventType string

// The 31 event types of AG-UI 1.0 (@ag-ui/core 1.0.0).
const (
	RunStarted              EventType = "RUN_STARTED"
	RunFinished             EventType = "RUN_FINISHED"
	RunError                EventType = "RUN_ERROR"
	StepStarted             EventType = "STEP_STARTED"
	StepFinished            EventType = "STEP_FINISHED"
	TextMessageStart        EventType = "TEXT_MESSAGE_START"
	TextMessageContent      EventType = "TEXT_MESSAGE_CONTENT"
	TextMessageEnd          EventType = "TEXT_MESSAGE_END"
	TextMessageChunk        EventType = "TEXT_MESSAGE_CHUNK"
	ToolCallStart           EventType = "TOOL_CALL_START"
	ToolCallArgs            EventType = "TOOL_CALL_ARGS"
	ToolCallEnd             EventType = "TOOL_CALL_END"
	ToolCallChunk           EventType = "TOOL_CALL_CHUNK"
	ToolCallResult          EventType = "TOOL_CALL_RESULT"
	StateSnapshot           EventType = "STATE_SNAPSHOT"
	StateDelta              EventType = "STATE_DELTA"
	MessagesSnapshot        EventType = "MESSAGES_SNAPSHOT"
	ActivitySnapshot        EventType = "ACTIVITY_SNAPSHOT"
	ActivityDelta           EventType = "ACTIVITY_DELTA"
	Raw                     EventType = "RAW"
	Custom                  EventType = "CUSTOM"
	ReasoningStart          EventType = "REASONING_START"
	ReasoningMessageStart   EventType = "REASONING_MESSAGE_START"
	ReasoningMessageContent EventType = "REASONING_MESSAGE_CONTENT"
	ReasoningMessageEnd     EventType = "REASONING_MESSAGE_END"
	ReasoningMessageChunk   EventType = "REASONING_MESSAGE_CHUNK"
	ReasoningEnd            EventType = "REASONING_END"
	ReasoningEncryptedValue EventType = "REASONING_ENCRYPTED_VALUE"
	SubagentStarted         EventType = "SUBAGENT_STARTED"
	SubagentFinished        EventType = "SUBAGENT_FINISHED"
	SubagentError           EventType = "SUBAGENT_ERROR"
)

// EventTypes lists the 31 types of AG-UI 1.0 in the order of @ag-ui/core.
var EventTypes = []EventType{
	RunStarted, RunFinished, RunError, StepStarted, StepFinished,
	TextMessageStart, TextMessageContent, TextMessageEnd, TextMessageChunk,
	ToolCallStart, ToolCallArgs, ToolCallEnd, ToolCallChunk, ToolCallResult,
	StateSnapshot, StateDelta, MessagesSnapshot, ActivitySnapshot, ActivityDelta,
	Raw, Custom,
	ReasoningStart, ReasoningMessageStart, ReasoningMessageContent, ReasoningMessageEnd,
	ReasoningMessageChunk, ReasoningEnd, ReasoningEncryptedValue,
	SubagentStarted, SubagentFinished, SubagentError,
}

// Valid reports whether t is one of the 31 AG-UI 1.0 types.
func (t EventType) Valid() bool {
	_, ok := schemas[t]
	return ok
}

// Terminal reports whether t ends a run (RUN_FINISHED or RUN_ERROR).
func (t EventType) Terminal() bool { return t == RunFinished || t == RunError }

var (
	// ErrNotJSON reports input that is not a JSON text.
	ErrNotJSON = errors.New("protocol: not JSON")
	// ErrPipelineFailed reports a push to a pipeline that already failed or
	// was ended with Fail.
	ErrPipelineFailed = errors.New("protocol: pipeline already failed")
)

// SchemaError is a rejection by the AG-UI 1.0 schema (zod's first issue).
type SchemaError struct {
	Path    string // zod's path joined with dots ("usage.0.inputTokens"); "" for the event itself
	Message string // zod's message
}

func (e *SchemaError) Error() string {
	if e.Path == "" {
		return e.Message
	}
	return e.Path + ": " + e.Message
}

// Event is one AG-UI event: its compact JSON encoding and the top-level
// members, decoded lazily. An Event is immutable once built, so it can be
// shared between goroutines.
type Event struct {
	typ EventType
	raw []byte
	m   []member
	buf [4]member // backs m for events of up to 4 members (most): one allocation per event
}

// Type returns the event's "type" ("" when it has no string type).
func (e *Event) Type() EventType { return e.typ }

// JSON returns the compact encoding of the event. The caller must not modify it.
func (e *Event) JSON() []byte { return e.raw }

// String returns the JSON encoding.
func (e *Event) String() string { return string(e.raw) }

// Field returns the encoded value of a top-level key, nil when absent.
func (e *Event) Field(key string) json.RawMessage { return lookup(e.m, key) }

// Str returns a top-level string field, "" when absent or not a string.
func (e *Event) Str(key string) string {
	v := lookup(e.m, key)
	if !isString(v) {
		return ""
	}
	return unquote(v)
}

// MarshalJSON returns the event's encoding.
func (e *Event) MarshalJSON() ([]byte, error) { return e.raw, nil }

// parseEvent compacts data and splits it, without any schema check. It fails
// only when data is not JSON (ErrNotJSON) or not an object (a SchemaError).
func parseEvent(data []byte) (*Event, error) {
	raw, err := compactJSON(make([]byte, 0, len(data)), data)
	if err != nil {
		return nil, err
	}
	return newEvent(raw)
}

// newEvent builds an event over compact JSON it takes ownership of.
func newEvent(raw []byte) (*Event, error) {
	if !isObject(raw) {
		return nil, &SchemaError{Message: "Invalid input: expected object, received " + kindOf(raw)}
	}
	e := &Event{raw: raw}
	e.m = splitObject(raw, e.buf[:0])
	if t := lookup(e.m, "type"); isString(t) {
		e.typ = internType(t)
	}
	return e, nil
}

// internType returns the EventType of a JSON string token, without
// allocating for the 31 known types.
func internType(tok []byte) EventType {
	if t, ok := typeByToken[string(tok)]; ok {
		return t
	}
	return EventType(unquote(tok))
}

var typeByToken = func() map[string]EventType {
	m := make(map[string]EventType, len(EventTypes))
	for _, t := range EventTypes {
		m[`"`+string(t)+`"`] = t
	}
	return m
}()

// eventFromMembers encodes ms as a new event.
func eventFromMembers(ms []member) *Event {
	size := 2
	for _, m := range ms {
		size += len(m.key) + len(m.val) + 8
	}
	e, _ := newEvent(appendObject(make([]byte, 0, size), ms))
	return e
}

// DecodeEvent decodes one event and checks it against the AG-UI 1.0 schema.
// A rejection is a *SchemaError; input that is not JSON wraps ErrNotJSON. The
// result is the schema's output: the input unchanged, except in
// RUN_STARTED.input (tools and context default to [], state null is removed).
func DecodeEvent(data []byte) (*Event, error) {
	e, err := parseEvent(data)
	if err != nil {
		return nil, err
	}
	return checkEvent(e)
}

// MustEvent decodes a schema-valid event and panics otherwise; it is meant
// for constants and tests.
func MustEvent(data string) *Event {
	e, err := DecodeEvent([]byte(data))
	if err != nil {
		panic(fmt.Sprintf("protocol.MustEvent(%s): %v", data, err))
	}
	return e
}
