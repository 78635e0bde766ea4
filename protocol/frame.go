package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// FrameKind tells client and server frames apart. The zero value is invalid.
type FrameKind uint8

const (
	// FrameRun is a client run frame (a RunAgentInput).
	FrameRun FrameKind = iota + 1
	// FrameAbort is a client abort frame: {"type":"abort","runId":s}.
	FrameAbort
	// FrameEnvelope is a server envelope: {"id":"<offset>","chunk":<event>}.
	FrameEnvelope
	// FrameEvent is a bare server event (a RUN_ERROR the gateway could not store).
	FrameEvent
	// FramePing is the server heartbeat {"type":"ping"}.
	FramePing
	// FrameAuth is a client auth frame: {"type":"auth","token":s}, a fresh token for the
	// socket's principal.
	FrameAuth
	// FrameFollow is a client follow frame: {"type":"follow","threadId":s}.
	FrameFollow
	// FrameUnfollow is a client unfollow frame: {"type":"unfollow","threadId":s}.
	FrameUnfollow
)

// ClientFrame is a decoded inbound text frame.
type ClientFrame struct {
	Kind     FrameKind      // FrameRun, FrameAbort, FrameAuth, FrameFollow or FrameUnfollow
	RunID    string         // the run to abort, or Input.RunID
	Input    *RunAgentInput // FrameRun only
	Token    string         // FrameAuth only; not checked beyond being a non-empty string
	ThreadID string         // FrameFollow and FrameUnfollow only; a non-empty string
}

// ErrBadFrame reports a server frame that is none of envelope, bare event, ping.
var ErrBadFrame = errors.New("protocol: not a gateway frame")

// DecodeClientFrame classifies an inbound text frame: an abort
// ({"type":"abort","runId":s}), an auth frame ({"type":"auth","token":s}; one
// whose token is not a non-empty string is an *InputError), a follow or
// unfollow frame ({"type":"follow","threadId":s}, {"type":"unfollow","threadId":s};
// one whose threadId is not a non-empty string is an *InputError), or a run frame
// (anything else, decoded as a RunAgentInput). Input that is not JSON wraps ErrNotJSON (the socket drops
// it); valid JSON that is not a valid input is an *InputError, which the
// gateway answers with a bare RUN_ERROR (code invalid_input, message
// err.Error()).
func DecodeClientFrame(data []byte) (ClientFrame, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return ClientFrame{}, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	raw := buf.Bytes()
	if isObject(raw) {
		ms := splitObject(raw, nil)
		t := lookup(ms, "type")
		if isString(t) && unquote(t) == "abort" {
			if id := lookup(ms, "runId"); isString(id) {
				return ClientFrame{Kind: FrameAbort, RunID: unquote(id)}, nil
			}
		}
		if isString(t) && unquote(t) == "auth" {
			if tok := lookup(ms, "token"); isString(tok) && unquote(tok) != "" {
				return ClientFrame{Kind: FrameAuth, Token: unquote(tok)}, nil
			}
			return ClientFrame{}, inputErr("token", "required non-empty string in an auth frame")
		}
		if isString(t) && (unquote(t) == "follow" || unquote(t) == "unfollow") {
			kind := FrameFollow
			if unquote(t) == "unfollow" {
				kind = FrameUnfollow
			}
			if id := lookup(ms, "threadId"); isString(id) && unquote(id) != "" {
				return ClientFrame{Kind: kind, ThreadID: unquote(id)}, nil
			}
			article := "a "
			if kind == FrameUnfollow {
				article = "an "
			}
			return ClientFrame{}, inputErr("threadId", "required non-empty string in "+article+unquote(t)+" frame")
		}
	}
	in, err := decodeInput(raw)
	if err != nil {
		return ClientFrame{}, err
	}
	return ClientFrame{Kind: FrameRun, RunID: in.RunID, Input: in}, nil
}

// AppendEnvelope appends {"id":"<offset>","chunk":<event>} to dst; event must
// be one compact JSON event.
func AppendEnvelope(dst []byte, offset string, event []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, offset)
	dst = append(dst, `,"chunk":`...)
	dst = append(dst, event...)
	return append(dst, '}')
}

// AppendRunEnvelope appends {"id":"<offset>","chunk":<event>,"runId":"<runID>"} to dst, the
// envelope of a followed thread's run; event must be one compact JSON event.
func AppendRunEnvelope(dst []byte, offset string, event []byte, runID string) []byte {
	dst = AppendEnvelope(dst, offset, event)
	dst = append(dst[:len(dst)-1], `,"runId":`...)
	dst = appendString(dst, runID)
	return append(dst, '}')
}

// AppendRunError appends a bare RUN_ERROR event to dst ("code" omitted when "").
func AppendRunError(dst []byte, message, code string) []byte {
	dst = append(dst, `{"type":"RUN_ERROR","message":`...)
	dst = appendString(dst, message)
	if code != "" {
		dst = append(dst, `,"code":`...)
		dst = appendString(dst, code)
	}
	return append(dst, '}')
}

// PingFrame is the server heartbeat frame. Do not modify it.
var PingFrame = []byte(`{"type":"ping"}`)

// RunAcceptedName is the CUSTOM event name of the gateway's marker event.
const RunAcceptedName = "run.accepted"

var runAccepted = MustEvent(`{"type":"CUSTOM","name":"run.accepted","value":{}}`)

// RunAccepted returns the gateway's marker event
// {"type":"CUSTOM","name":"run.accepted","value":{}}, the first entry of every
// run log. It is outside the verified sequence: it is never pushed through a
// Pipeline. The event is shared and immutable.
func RunAccepted() *Event { return runAccepted }

// RunQueuedName is the CUSTOM event name of the event a queued run stores after its marker.
const RunQueuedName = "run.queued"

// RunQueued returns {"type":"CUSTOM","name":"run.queued","value":{"ahead":N}}, stored after
// the marker of a run that waits behind ahead earlier runs of its thread (THREADS.md section
// 6). Like the marker, it is never pushed through a Pipeline.
func RunQueued(ahead int) *Event {
	return MustEvent(string(runQueuedPrefix) + `"value":{"ahead":` + strconv.Itoa(ahead) + `}}`)
}

// IsRunQueued reports whether event (compact JSON, as RunQueued makes it) is a run.queued.
func IsRunQueued(event []byte) bool { return bytes.HasPrefix(event, runQueuedPrefix) }

// runQueuedPrefix is how every event RunQueued makes begins.
var runQueuedPrefix = []byte(`{"type":"CUSTOM","name":"` + RunQueuedName + `",`)

// ThreadBranchName is the CUSTOM event name of the frame a thread's followers get when its
// active branch switches (THREADS.md section 7).
const ThreadBranchName = "thread.branch"

// ThreadBranch returns {"type":"CUSTOM","name":"thread.branch","value":{"messageId":M,
// "threadId":T}}: the thread's active branch is now the one holding messageID.
func ThreadBranch(threadID, messageID string) []byte {
	type value struct {
		MessageID string `json:"messageId"`
		ThreadID  string `json:"threadId"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Value value  `json:"value"`
	}{"CUSTOM", ThreadBranchName, value{messageID, threadID}})
	return b
}

// ServerFrame is a decoded outbound frame, for clients and tests.
type ServerFrame struct {
	Kind   FrameKind // FrameEnvelope, FrameEvent or FramePing
	Offset string    // FrameEnvelope only
	Event  []byte    // the event JSON (compact), FrameEnvelope and FrameEvent
	Type   EventType // the event's type, FrameEnvelope and FrameEvent
}

// DecodeServerFrame decodes an envelope, a bare event, or a ping. The event
// is not schema-checked.
func DecodeServerFrame(data []byte) (ServerFrame, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return ServerFrame{}, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	raw := buf.Bytes()
	if !isObject(raw) {
		return ServerFrame{}, fmt.Errorf("%w: %s", ErrBadFrame, kindOf(raw))
	}
	ms := splitObject(raw, nil)
	if t := lookup(ms, "type"); t != nil {
		if !isString(t) || unquote(t) == "" {
			return ServerFrame{}, fmt.Errorf("%w: type is not a non-empty string", ErrBadFrame)
		}
		if unquote(t) == "ping" {
			return ServerFrame{Kind: FramePing}, nil
		}
		return ServerFrame{Kind: FrameEvent, Event: raw, Type: EventType(unquote(t))}, nil
	}
	id, chunk := lookup(ms, "id"), lookup(ms, "chunk")
	if !isString(id) || unquote(id) == "" {
		return ServerFrame{}, fmt.Errorf("%w: envelope without a string id", ErrBadFrame)
	}
	if !isObject(chunk) {
		return ServerFrame{}, fmt.Errorf("%w: envelope without an event", ErrBadFrame)
	}
	ct := lookup(splitObject(chunk, nil), "type")
	if !isString(ct) {
		return ServerFrame{}, fmt.Errorf("%w: envelope event without a type", ErrBadFrame)
	}
	return ServerFrame{Kind: FrameEnvelope, Offset: unquote(id), Event: chunk, Type: EventType(unquote(ct))}, nil
}
