package protocol

import (
	"math"
	"regexp"
	"strconv"
	"strings"
)

// This file ports the zod schemas of @ag-ui/core 1.0.0 (AGUI.md section 1).
// Every object is loose: unknown keys pass and are kept. A checker reports
// the first issue in schema order with its path relative to the checked value.

type issue struct {
	rev []string // path segments, innermost first
	msg string
}

func (is *issue) at(seg string) *issue {
	is.rev = append(is.rev, seg)
	return is
}

func (is *issue) err() *SchemaError {
	segs := make([]string, len(is.rev))
	for i, s := range is.rev {
		segs[len(segs)-1-i] = s
	}
	return &SchemaError{Path: strings.Join(segs, "."), Message: is.msg}
}

func bad(msg string) *issue { return &issue{msg: msg} }

// checker validates one value; v is nil when the key is absent.
type checker func(v []byte) *issue

type field struct {
	key string
	req bool
	c   checker
}

type shape []field

func (s shape) check(ms []member) *issue {
	for _, f := range s {
		v := lookup(ms, f.key)
		if v == nil && !f.req {
			continue
		}
		if is := f.c(v); is != nil {
			return is.at(f.key)
		}
	}
	return nil
}

func expected(what string, v []byte) *issue {
	return bad("Invalid input: expected " + what + ", received " + kindOf(v))
}

func str(v []byte) *issue {
	if !isString(v) {
		return expected("string", v)
	}
	return nil
}

func boolean(v []byte) *issue {
	if v == nil || (v[0] != 't' && v[0] != 'f') {
		return expected("boolean", v)
	}
	return nil
}

const maxSafe = 1<<53 - 1

// integer checks a safe integer within [min, maxSafe].
func integer(min float64) checker {
	return func(v []byte) *issue {
		if kindOf(v) != "number" {
			return expected("number", v)
		}
		f, _ := strconv.ParseFloat(string(v), 64)
		switch {
		case math.IsInf(f, 0):
			return bad("Invalid input: expected number, received number")
		case f != math.Trunc(f):
			return bad("Invalid input: expected int, received number")
		case f > maxSafe:
			return bad("Too big: expected int to be <9007199254740991")
		case f < -maxSafe:
			return bad("Too small: expected int to be >-9007199254740991")
		case f < min:
			return bad("Too small: expected number to be >=" + strconv.FormatFloat(min, 'f', -1, 64))
		}
		return nil
	}
}

func enum(vals ...string) checker {
	quoted := make([]string, len(vals))
	for i, s := range vals {
		quoted[i] = strconv.Quote(s)
	}
	msg := "Invalid option: expected one of " + strings.Join(quoted, "|")
	return func(v []byte) *issue {
		if isString(v) {
			s := unquote(v)
			for _, x := range vals {
				if s == x {
					return nil
				}
			}
		}
		return bad(msg)
	}
}

func literal(s string) checker {
	msg := "Invalid input: expected " + strconv.Quote(s)
	return func(v []byte) *issue {
		if !isString(v) || unquote(v) != s {
			return bad(msg)
		}
		return nil
	}
}

// record is a non-null, non-array object of any values.
func record(v []byte) *issue {
	if !isObject(v) {
		return bad("Invalid input")
	}
	return nil
}

// anyNonNull is an optional any-valued field that refuses null.
func anyNonNull(v []byte) *issue {
	if v == nil || isNull(v) {
		return bad("Invalid input")
	}
	return nil
}

// anyValue is a required any-valued field; null is allowed.
func anyValue(v []byte) *issue {
	if v == nil {
		return bad("Invalid input")
	}
	return nil
}

func array(elem checker, min int) checker {
	return func(v []byte) *issue {
		if !isArray(v) {
			return expected("array", v)
		}
		var buf [8][]byte
		els := splitArray(v, buf[:0])
		if len(els) < min {
			return bad("Too small: expected array to have >=" + strconv.Itoa(min) + " items")
		}
		for i, el := range els {
			if is := elem(el); is != nil {
				return is.at(strconv.Itoa(i))
			}
		}
		return nil
	}
}

func object(s shape) checker {
	return func(v []byte) *issue {
		if !isObject(v) {
			return expected("object", v)
		}
		var buf [8]member
		return s.check(splitObject(v, buf[:0]))
	}
}

// discriminated is a union of loose objects told apart by key.
func discriminated(key string, variants map[string]shape) checker {
	return func(v []byte) *issue {
		if !isObject(v) {
			return expected("object", v)
		}
		var buf [8]member
		ms := splitObject(v, buf[:0])
		d := lookup(ms, key)
		s, ok := variants[unquote(d)]
		if !isString(d) || !ok {
			return bad("Invalid input").at(key)
		}
		return s.check(ms)
	}
}

func union(cs ...checker) checker {
	return func(v []byte) *issue {
		for _, c := range cs {
			if c(v) == nil {
				return nil
			}
		}
		return bad("Invalid input")
	}
}

var pointerRE = regexp.MustCompile(`^(/([^/~]|~[01])*)*$`)

func pointer(v []byte) *issue {
	if !isString(v) {
		return expected("string", v)
	}
	if !pointerRE.MatchString(unquote(v)) {
		return bad("Invalid string: must match pattern /^(\\/([^/~]|~[01])*)*$/")
	}
	return nil
}

func opt(key string, c checker) field { return field{key: key, c: c} }
func req(key string, c checker) field { return field{key: key, req: true, c: c} }

var (
	textRole = enum("developer", "system", "assistant", "user")

	source = discriminated("type", map[string]shape{
		"data": {req("type", str), req("value", str), req("mimeType", str)},
		"url":  {req("type", str), req("value", str), opt("mimeType", str)},
		"file": {req("type", str), req("value", str), opt("provider", str), opt("mimeType", str)},
	})
	mediaPart   = shape{req("type", str), opt("id", str), req("source", source), opt("metadata", anyNonNull)}
	contentPart = discriminated("type", map[string]shape{
		"text":     {req("type", str), opt("id", str), req("text", str), opt("metadata", anyNonNull)},
		"image":    mediaPart,
		"audio":    mediaPart,
		"video":    mediaPart,
		"document": mediaPart,
	})
	content = union(str, array(contentPart, 0))

	toolCall = object(shape{
		req("id", str), req("type", literal("function")),
		req("function", object(shape{req("name", str), req("arguments", str)})),
		opt("encryptedValue", str), opt("metadata", record),
	})

	// Message shapes in @ag-ui/core's key order: subagentRunId, id, role, then the rest.
	named   = []field{opt("name", str), opt("encryptedValue", str), opt("metadata", record)}
	message = discriminated("role", map[string]shape{
		"developer": messageShape(append(named, req("content", str))...),
		"system":    messageShape(append(named, req("content", str))...),
		"assistant": messageShape(append(named, opt("content", str), opt("toolCalls", array(toolCall, 0)))...),
		"user":      messageShape(append(named, req("content", content))...),
		"tool":      messageShape(req("content", content), req("toolCallId", str), opt("error", str), opt("encryptedValue", str), opt("metadata", record)),
		"activity":  messageShape(req("activityType", str), req("content", record), opt("metadata", record)),
		"reasoning": messageShape(req("content", str), opt("encryptedValue", str), opt("metadata", record)),
	})

	tool = object(shape{req("name", str), req("description", str), opt("parameters", anyNonNull), opt("metadata", record)})
	ctx  = object(shape{req("description", str), req("value", str)})
	// resume entries of RunAgentInput.
	resume = object(shape{req("interruptId", str), req("status", enum("resolved", "cancelled")), opt("payload", anyNonNull), opt("metadata", record)})

	runAgentInput = object(shape{
		req("threadId", str), req("runId", str), opt("protocolVersion", str), opt("parentRunId", str),
		req("messages", array(message, 0)),
		opt("tools", array(tool, 0)), opt("context", array(ctx, 0)),
		opt("forwardedProps", anyNonNull), opt("resume", array(resume, 0)),
	})

	interrupt = object(shape{
		opt("subagentRunId", str), req("id", str), req("reason", str), opt("message", str), opt("toolCallId", str),
		opt("responseSchema", record), opt("expiresAt", str), opt("metadata", record),
	})
	runOutcome = discriminated("type", map[string]shape{
		"success":   {opt("pendingToolCallIds", array(str, 0))},
		"interrupt": {req("interrupts", array(interrupt, 1))},
		"cancelled": {},
	})
	subagentOutcome = discriminated("type", map[string]shape{
		"success":   {},
		"suspended": {opt("interruptIds", array(str, 0))},
	})
	usage = array(object(shape{
		opt("provider", str), opt("model", str),
		opt("inputTokens", integer(0)), opt("outputTokens", integer(0)), opt("totalTokens", integer(0)),
		opt("reasoningTokens", integer(0)), opt("cachedInputTokens", integer(0)), opt("cacheWriteInputTokens", integer(0)),
	}), 0)

	patchOp = discriminated("op", map[string]shape{
		"add":     {req("path", pointer), req("value", anyValue)},
		"replace": {req("path", pointer), req("value", anyValue)},
		"test":    {req("path", pointer), req("value", anyValue)},
		"remove":  {req("path", pointer)},
		"move":    {req("from", pointer), req("path", pointer)},
		"copy":    {req("from", pointer), req("path", pointer)},
	})
	patch = array(patchOp, 0)
)

func messageShape(fs ...field) shape {
	s := shape{opt("subagentRunId", str), req("id", str)}
	return append(s, fs...)
}

// envelope holds the fields every event declares.
var envelope = shape{opt("timestamp", integer(-maxSafe)), opt("rawEvent", anyNonNull), opt("metadata", record)}

// schemas maps each type to its own fields, after the envelope.
var schemas = buildSchemas()

func buildSchemas() map[EventType]shape {
	schemas := map[EventType]shape{}
	sub := opt("subagentRunId", str)
	subReq := req("subagentRunId", str)
	def := func(t EventType, fs ...field) { schemas[t] = fs }
	def(RunStarted, req("threadId", str), req("runId", str), opt("protocolVersion", str), opt("parentRunId", str), opt("input", runAgentInput))
	def(RunFinished, req("threadId", str), req("runId", str), opt("result", anyNonNull), opt("outcome", runOutcome), opt("usage", usage))
	def(RunError, req("message", str), opt("code", str), opt("usage", usage))
	def(StepStarted, sub, req("stepName", str))
	def(StepFinished, sub, req("stepName", str))
	def(TextMessageStart, sub, req("messageId", str), opt("role", textRole), opt("name", str))
	def(TextMessageContent, sub, req("messageId", str), req("delta", str))
	def(TextMessageEnd, sub, req("messageId", str))
	def(TextMessageChunk, sub, opt("messageId", str), opt("role", textRole), opt("delta", str), opt("name", str))
	def(ToolCallStart, sub, req("toolCallId", str), req("toolCallName", str), opt("parentMessageId", str))
	def(ToolCallArgs, sub, req("toolCallId", str), req("delta", str))
	def(ToolCallEnd, sub, req("toolCallId", str))
	def(ToolCallChunk, sub, opt("toolCallId", str), opt("toolCallName", str), opt("parentMessageId", str), opt("delta", str))
	def(ToolCallResult, sub, req("messageId", str), req("toolCallId", str), req("content", content), opt("role", literal("tool")))
	def(StateSnapshot, sub, req("snapshot", anyValue))
	def(StateDelta, sub, req("delta", patch))
	def(MessagesSnapshot, req("messages", array(message, 0)))
	def(ActivitySnapshot, sub, req("messageId", str), req("activityType", str), req("content", record), opt("replace", boolean))
	def(ActivityDelta, sub, req("messageId", str), req("activityType", str), req("patch", patch))
	def(Raw, sub, req("event", anyValue), opt("source", str))
	def(Custom, sub, req("name", str), req("value", anyValue))
	def(ReasoningStart, sub, req("messageId", str))
	def(ReasoningMessageStart, sub, req("messageId", str), req("role", literal("reasoning")))
	def(ReasoningMessageContent, sub, req("messageId", str), req("delta", str))
	def(ReasoningMessageEnd, sub, req("messageId", str))
	def(ReasoningMessageChunk, sub, opt("messageId", str), opt("delta", str))
	def(ReasoningEnd, sub, req("messageId", str))
	def(ReasoningEncryptedValue, sub, req("subtype", enum("tool-call", "message")), req("entityId", str), req("encryptedValue", str))
	def(SubagentStarted, subReq, req("name", str), opt("description", str), opt("parentSubagentRunId", str), opt("parentToolCallId", str), opt("parentMessageId", str))
	def(SubagentFinished, subReq, opt("result", anyNonNull), opt("outcome", subagentOutcome))
	def(SubagentError, subReq, req("message", str), opt("code", str))
	return schemas
}

// checkEvent validates e against its type's schema and returns the schema's
// output (e itself unless RUN_STARTED.input needs its defaults).
func checkEvent(e *Event) (*Event, error) {
	s, ok := schemas[e.typ]
	if !ok || !isString(lookup(e.m, "type")) {
		return nil, &SchemaError{Path: "type", Message: "Invalid input"}
	}
	if is := envelope.check(e.m); is != nil {
		return nil, is.err()
	}
	if is := s.check(e.m); is != nil {
		return nil, is.err()
	}
	if e.typ == RunStarted {
		if in := lookup(e.m, "input"); in != nil {
			if out, changed := normalizeInput(in); changed {
				return e.with("input", out), nil
			}
		}
	}
	return e, nil
}

// normalizeInput applies the RunAgentInput parse output rules to a valid
// encoded input: state null is removed, tools and context default to [].
func normalizeInput(in []byte) ([]byte, bool) {
	ms := splitObject(in, nil)
	changed := false
	out := ms[:0:0]
	for _, m := range ms {
		if m.key == "state" && isNull(m.val) {
			changed = true
			continue
		}
		out = append(out, m)
	}
	for _, k := range []string{"tools", "context"} {
		if lookup(out, k) == nil {
			out = append(out, member{key: k, val: []byte("[]")})
			changed = true
		}
	}
	if !changed {
		return in, false
	}
	return appendObject(nil, out), true
}

// with returns a copy of e with key set to val (replaced in place, or appended).
func (e *Event) with(key string, val []byte) *Event {
	ms := make([]member, 0, len(e.m)+1)
	found := false
	for _, m := range e.m {
		if m.key == key {
			if found {
				continue
			}
			m.val = val
			found = true
		}
		ms = append(ms, m)
	}
	if !found {
		ms = append(ms, member{key: key, val: val})
	}
	return eventFromMembers(ms)
}
