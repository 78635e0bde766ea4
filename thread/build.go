package thread

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wsgateway/wsgateway/internal/jsoncompact"
	"github.com/wsgateway/wsgateway/protocol"
)

// This file ports StreamProcessor of @tanstack/ai 0.58.0
// (dist/esm/activities/chat/stream/processor.js and message-updaters.js) as
// ChatClient of @tanstack/ai-client 0.33.2 drives it: prepareAssistantMessage,
// then processChunk(restoreInboundChunk(event)) per event, then finalizeStream
// unless the run ended with RUN_ERROR. Names follow the original so that the
// two can be read side by side. Not ported: structured output
// (CUSTOM structured-output.*) and CUSTOM ui-resource, which no agent of this
// project sends; MESSAGES_SNAPSHOT is ported for the message kinds listed at
// snapshotMessage.

// event is one event split into its members (protocol.Fields, reused from
// event to event); get mirrors restoreInboundChunk, which copies
// metadata.tanstack's keys to the top level where the event has none. Values
// alias the event's memory until the next parse: what the builder keeps, it
// copies (keep).
type event struct {
	f, md, ts protocol.Fields
	hasTS     bool
}

func (e *event) parse(raw []byte) error {
	if err := e.f.Parse(raw); err != nil {
		return err
	}
	// tanstackMetadata: value.metadata.tanstack when metadata is an object, else
	// value.tanstack.
	if e.f.Object("metadata", &e.md) {
		e.hasTS = e.md.Object("tanstack", &e.ts)
	} else {
		e.hasTS = e.f.Object("tanstack", &e.ts)
	}
	return nil
}

// tanstackOf is tanstackMetadata of a decoded object.
func tanstackOf(m map[string]json.RawMessage) map[string]json.RawMessage {
	src := m
	if md, ok := m["metadata"]; ok && isObject(md) {
		src = object(md)
	}
	if t, ok := src["tanstack"]; ok && isObject(t) {
		return object(t)
	}
	return nil
}

// raw returns a top-level member, nil when absent.
func (e *event) raw(key string) json.RawMessage { return e.f.Raw(key) }

// tanstack returns a member of metadata.tanstack, nil when absent.
func (e *event) tanstack(key string) json.RawMessage {
	if !e.hasTS {
		return nil
	}
	return e.ts.Raw(key)
}

func (e *event) get(key string) (json.RawMessage, bool) {
	if v := e.f.Raw(key); v != nil {
		return v, true
	}
	if key == "usage" || key == "interruptErrors" {
		return nil, false
	}
	v := e.tanstack(key)
	return v, v != nil
}

// keep copies a value out of the event's memory.
func keep(v json.RawMessage) json.RawMessage {
	if v == nil {
		return nil
	}
	return append(json.RawMessage(nil), v...)
}

// str returns a string field, and whether it is one.
func (e *event) str(key string) (string, bool) {
	v, ok := e.get(key)
	if !ok {
		return "", false
	}
	return asString(v)
}

func asString(v json.RawMessage) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if body := v[1 : len(v)-1]; bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body) {
		return string(body), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

func isObject(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{'
}

func object(v json.RawMessage) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(v, &m)
	return m
}

// nullish is JavaScript's null or undefined.
func nullish(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

// opt is a JavaScript string that may be null or undefined.
type opt struct {
	s  string
	ok bool
}

func some(s string) opt { return opt{s, true} }

// truthy is a string's truth in a JavaScript condition.
func (o opt) truthy() bool { return o.ok && o.s != "" }

type toolCall struct {
	id, name  string
	arguments string
	state     string
	metadata  json.RawMessage
}

type msgState struct {
	id, role string
	// seg is currentSegmentText; lastEmittedText is always a prefix of it,
	// its first emitted bytes.
	seg                      *segment
	emitted                  int
	thinkingSteps            map[string]string
	thinkingStepSignatures   map[string]string
	currentThinkingStepID    opt
	toolCalls                map[string]*toolCall
	toolCallOrder            []string
	hasToolCallsSinceTextStr bool
	isComplete               bool
}

// builder is the processor's state for one run.
type builder struct {
	runID  string
	minted int
	now    string // createdAt of messages the run creates: the latest event timestamp

	msgs []Message

	states            []*msgState // a Map: insertion order matters
	activeMessageIDs  []string    // a Set
	toolCallToMessage map[string]string
	pendingManualID   string // "" is null (it is never an empty id)
	pendingThinkingID string // likewise
	activeRuns        []string
	finishReason      json.RawMessage
	hasError          bool
	isDone            bool
	last              string            // the type of the last event
	ev                event             // the event being applied (its memory is reused)
	interrupts        []json.RawMessage // the last RUN_FINISHED's interrupt outcome
}

func newBuilder(runID string, settled []Message) *builder {
	b := &builder{runID: runID, msgs: make([]Message, len(settled))}
	for i, m := range settled {
		b.msgs[i] = m.clone()
	}
	b.prepareAssistantMessage()
	return b
}

func (m Message) clone() Message {
	m.Parts = append([]Part(nil), m.Parts...)
	for i := range m.Parts {
		if a := m.Parts[i].Approval; a != nil {
			c := *a
			m.Parts[i].Approval = &c
		}
	}
	return m
}

// mint returns a deterministic id for what the client names at random.
func (b *builder) mint(kind string) string {
	b.minted++
	return b.runID + "-" + kind + strconv.Itoa(b.minted)
}

func (b *builder) prepareAssistantMessage() {
	b.states = nil
	b.activeMessageIDs = nil
	b.activeRuns = nil
	b.toolCallToMessage = map[string]string{}
	b.pendingManualID = ""
	b.pendingThinkingID = ""
	b.finishReason = nil
	b.hasError = false
	b.isDone = false
}

// --- ordered collections

func (b *builder) state(id string) *msgState {
	for _, s := range b.states {
		if s.id == id {
			return s
		}
	}
	return nil
}

func (b *builder) deleteState(id string) {
	for i, s := range b.states {
		if s.id == id {
			b.states = append(b.states[:i], b.states[i+1:]...)
			return
		}
	}
}

// setState is Map.set: an existing key keeps its place.
func (b *builder) setState(id string, st *msgState) {
	for i, s := range b.states {
		if s.id == id {
			b.states[i] = st
			return
		}
	}
	b.states = append(b.states, st)
}

func (b *builder) find(id string) *Message {
	for i := range b.msgs {
		if b.msgs[i].ID == id {
			return &b.msgs[i]
		}
	}
	return nil
}

// each calls f on every message with the id (the updaters map over all of them).
func (b *builder) each(id string, f func(*Message)) {
	for i := range b.msgs {
		if b.msgs[i].ID == id {
			f(&b.msgs[i])
		}
	}
}

// segment is a text segment's bytes, appended to in place: a text part keeps
// the segment and its length when emitted, and becomes a string once (text),
// so that a long reply costs linear time, not a copy per delta.
type segment struct{ buf []byte }

// pending reports whether the segment has text not yet emitted.
func (st *msgState) pending() bool { return len(st.seg.buf) != st.emitted }

// text returns a text part's content, materialising it.
func (p *Part) text() string {
	if p.seg != nil {
		p.Content = string(p.seg.buf[:p.segN])
		p.seg = nil
	}
	return p.Content
}

// settle materialises every text part of msgs.
func settle(msgs []Message) {
	for i := range msgs {
		for j := range msgs[i].Parts {
			msgs[i].Parts[j].text()
		}
	}
}

func (b *builder) createMessageState(id, role string) *msgState {
	st := &msgState{
		id: id, role: role, seg: &segment{},
		thinkingSteps:          map[string]string{},
		thinkingStepSignatures: map[string]string{},
		toolCalls:              map[string]*toolCall{},
	}
	b.setState(id, st)
	return st
}

// addStep records a thinking step once, in order.
func (st *msgState) addStep(id, content string) {
	if _, ok := st.thinkingSteps[id]; !ok {
		st.thinkingSteps[id] = content
	}
}

func (b *builder) activeAssistantID() opt {
	for i := len(b.activeMessageIDs) - 1; i >= 0; i-- {
		id := b.activeMessageIDs[i]
		if s := b.state(id); s != nil && s.role == "assistant" {
			return some(id)
		}
	}
	for i := len(b.states) - 1; i >= 0; i-- {
		if b.states[i].role == "assistant" {
			return some(b.states[i].id)
		}
	}
	return opt{}
}

func (b *builder) resumeAssistantState(id string, st *msgState) {
	addOnce(&b.activeMessageIDs, id)
	if st.isComplete || b.isDone {
		st.isComplete = false
		b.isDone = false
	}
}

func (b *builder) ensureAssistantMessage(preferred opt) (string, *msgState) {
	if preferred.truthy() {
		if st := b.state(preferred.s); st != nil {
			b.resumeAssistantState(preferred.s, st)
			return preferred.s, st
		}
	}
	if active := b.activeAssistantID(); active.truthy() {
		if st := b.state(active.s); st != nil {
			b.resumeAssistantState(active.s, st)
			return active.s, st
		}
	}
	if preferred.truthy() {
		if m := b.find(preferred.s); m != nil {
			st := b.createMessageState(preferred.s, m.Role)
			addOnce(&b.activeMessageIDs, preferred.s)
			if n := len(m.Parts); n > 0 && m.Parts[n-1].Type == "text" {
				text := m.Parts[n-1].text()
				st.seg = &segment{buf: []byte(text)}
				st.emitted = len(text)
			}
			return preferred.s, st
		}
	}
	id := preferred.s
	if !preferred.truthy() {
		id = b.mint("a")
	}
	b.msgs = append(b.msgs, Message{ID: id, Role: "assistant", Parts: []Part{}, CreatedAt: b.now})
	st := b.createMessageState(id, "assistant")
	addOnce(&b.activeMessageIDs, id)
	b.pendingManualID = id
	return id, st
}

// --- apply

// apply processes one stored event.
func (b *builder) apply(raw []byte) error {
	e := &b.ev
	if err := e.parse(raw); err != nil {
		return err
	}
	typ := e.f.Str("type") // interned: no allocation
	b.last = typ
	if ts := e.raw("timestamp"); ts != nil {
		if ms, err := strconv.ParseFloat(string(ts), 64); err == nil && ms > 0 && ms < 1e15 {
			b.now = time.UnixMilli(int64(ms)).UTC().Format("2006-01-02T15:04:05.000Z")
		}
	}
	switch typ {
	case "TEXT_MESSAGE_START":
		b.textMessageStart(e)
	case "TEXT_MESSAGE_CONTENT":
		b.textMessageContent(e)
	case "TEXT_MESSAGE_END":
		b.textMessageEnd(e)
	case "TOOL_CALL_START":
		b.toolCallStart(e)
	case "TOOL_CALL_ARGS":
		b.toolCallArgs(e)
	case "TOOL_CALL_END":
		b.toolCallEnd(e)
	case "TOOL_CALL_RESULT":
		b.toolCallResult(e)
	case "RUN_STARTED":
		id, _ := e.str("runId")
		addOnce(&b.activeRuns, id)
	case "RUN_FINISHED":
		b.runFinished(e)
	case "RUN_ERROR":
		b.runError(e)
	case "STEP_STARTED":
		b.stepStarted(e)
	case "STEP_FINISHED":
		b.stepFinished(e)
	case "REASONING_MESSAGE_CONTENT":
		b.reasoningContent(e)
	case "REASONING_ENCRYPTED_VALUE":
		b.encryptedValue(e)
	case "MESSAGES_SNAPSHOT":
		b.messagesSnapshot(e)
	case "CUSTOM":
		b.custom(e)
	}
	return nil
}

func uiRole(e *event) string {
	switch r, _ := e.str("role"); r {
	case "user", "system":
		return r
	}
	return "assistant"
}

// resetSegment starts a new text segment after tool calls.
func (b *builder) resetSegment(id string, st *msgState) {
	if st.hasToolCallsSinceTextStr {
		if st.pending() {
			b.emitTextUpdate(id)
		}
		st.seg, st.emitted = &segment{}, 0
		st.hasToolCallsSinceTextStr = false
	}
}

func (b *builder) textMessageStart(e *event) {
	id, _ := e.str("messageId")
	role := uiRole(e)
	if b.pendingManualID != "" {
		pending := b.pendingManualID
		b.pendingManualID = ""
		if pending != id {
			b.each(pending, func(m *Message) { m.ID = id })
			if st := b.state(pending); st != nil {
				st.id = id
				b.deleteState(pending)
				b.setState(id, st)
			}
			remove(&b.activeMessageIDs, pending)
			addOnce(&b.activeMessageIDs, id)
			for call, owner := range b.toolCallToMessage {
				if owner == pending {
					b.toolCallToMessage[call] = id
				}
			}
		}
		if st := b.state(id); st == nil {
			b.createMessageState(id, role)
			addOnce(&b.activeMessageIDs, id)
		} else {
			b.resetSegment(id, st)
		}
		b.mergeMessageMetadata(id, e.raw("metadata"))
		return
	}
	if b.find(id) != nil {
		addOnce(&b.activeMessageIDs, id)
		if st := b.state(id); st == nil {
			b.createMessageState(id, role)
		} else {
			b.resetSegment(id, st)
		}
		b.mergeMessageMetadata(id, e.raw("metadata"))
		return
	}
	b.msgs = append(b.msgs, Message{ID: id, Role: role, Parts: []Part{}, CreatedAt: b.now})
	b.createMessageState(id, role)
	addOnce(&b.activeMessageIDs, id)
	b.mergeMessageMetadata(id, e.raw("metadata"))
}

func (b *builder) textMessageContent(e *event) {
	mid, ok := e.str("messageId")
	id, st := b.ensureAssistantMessage(opt{mid, ok})
	b.mergeMessageMetadata(id, e.raw("metadata"))
	if st.hasToolCallsSinceTextStr && len(st.seg.buf) > 0 {
		if st.pending() {
			b.emitTextUpdate(id)
		}
		st.seg, st.emitted = &segment{}, 0
	}
	st.hasToolCallsSinceTextStr = false
	delta, _ := e.str("delta")
	st.seg.buf = append(st.seg.buf, delta...)
	if st.pending() {
		b.emitTextUpdate(id)
	}
}

func (b *builder) textMessageEnd(e *event) {
	id, _ := e.str("messageId")
	b.mergeMessageMetadata(id, e.raw("metadata"))
	st := b.state(id)
	if st == nil || st.isComplete {
		return
	}
	if st.pending() {
		b.emitTextUpdate(id)
	}
}

// emitTextUpdate is emitTextUpdateForMessage and updateTextPart: the last text
// part holds the current segment, or a new one follows a non-text part.
func (b *builder) emitTextUpdate(id string) {
	st := b.state(id)
	if st == nil {
		return
	}
	st.emitted = len(st.seg.buf)
	p := Part{Type: "text", seg: st.seg, segN: st.emitted}
	b.each(id, func(m *Message) {
		if n := len(m.Parts); n > 0 && m.Parts[n-1].Type == "text" {
			m.Parts[n-1] = p
			return
		}
		m.Parts = append(m.Parts, p)
	})
}

// mergeMessageMetadata merges an event's metadata object onto the message
// (metadata.tanstack deep-merged, without its content and args), and takes
// createdAt from metadata.tanstack.createdAt.
func (b *builder) mergeMessageMetadata(id string, incoming json.RawMessage) {
	if !isObject(incoming) {
		return
	}
	m := b.find(id)
	if m == nil {
		return
	}
	in := object(incoming)
	it := tanstackOf(in)
	if it != nil {
		_, c := it["content"]
		_, a := it["args"]
		if c || a {
			t := make(map[string]json.RawMessage, len(it))
			for k, v := range it {
				if k != "content" && k != "args" {
					t[k] = v
				}
			}
			in = clone(in)
			in["tanstack"] = mustJSON(t)
		}
	}
	merged := mergeMetadata(m.Metadata, in)
	createdAt := ""
	if it != nil {
		createdAt = coerceCreatedAt(it["createdAt"])
	}
	b.each(id, func(m *Message) {
		m.Metadata = merged
		if createdAt != "" {
			m.CreatedAt = createdAt
		}
	})
}

func clone(m map[string]json.RawMessage) map[string]json.RawMessage {
	c := make(map[string]json.RawMessage, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	return c
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func mergeMetadata(current json.RawMessage, incoming map[string]json.RawMessage) json.RawMessage {
	if nullish(current) || !isObject(current) {
		return mustJSON(incoming)
	}
	cur := object(current)
	merged := clone(cur)
	for k, v := range incoming {
		merged[k] = v
	}
	if ct, it := cur["tanstack"], incoming["tanstack"]; isObject(ct) && isObject(it) {
		t := object(ct)
		for k, v := range object(it) {
			t[k] = v
		}
		merged["tanstack"] = mustJSON(t)
	}
	return mustJSON(merged)
}

// coerceCreatedAt returns an ISO createdAt a string value stands for, or "".
func coerceCreatedAt(v json.RawMessage) string {
	s, ok := asString(v)
	if !ok {
		return ""
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// --- tool calls

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

// --- runs

func (b *builder) runFinished(e *event) {
	if v := e.raw("finishReason"); v != nil {
		b.finishReason = keep(v)
	} else {
		b.finishReason = keep(e.tanstack("finishReason"))
	}
	id, _ := e.str("runId")
	remove(&b.activeRuns, id)
	b.interrupts = nil
	interrupt := false
	if oc := e.raw("outcome"); isObject(oc) {
		o := object(oc)
		if t, _ := asString(o["type"]); t == "interrupt" {
			interrupt = true
			var list []json.RawMessage
			_ = json.Unmarshal(o["interrupts"], &list)
			b.interrupts = list
			b.handleInterrupts(list)
		}
	}
	if len(b.activeRuns) == 0 {
		b.completeAllToolCalls()
		if fr, _ := asString(b.finishReason); fr == "tool_calls" && !interrupt {
			return
		}
		b.isDone = true
		b.finalizeStream()
	}
}

func (b *builder) handleInterrupts(list []json.RawMessage) {
	for _, raw := range list {
		in := object(raw)
		if in == nil {
			continue
		}
		callID, _ := asString(in["toolCallId"])
		if callID == "" {
			continue
		}
		md := object(in["metadata"])
		kind, _ := asString(md["kind"])
		reason, _ := asString(in["reason"])
		if kind != "approval" && reason != "approval_required" {
			continue
		}
		target := b.activeAssistantID()
		if !target.ok {
			if id, ok := b.toolCallToMessage[callID]; ok {
				target = some(id)
			} else {
				target = b.messageWithCall(callID, "assistant")
			}
		}
		if target.truthy() {
			id, _ := asString(in["id"])
			b.updateToolCallApproval(target.s, callID, id)
		}
	}
}

func (b *builder) updateToolCallApproval(id, callID, approvalID string) {
	b.each(id, func(m *Message) {
		for i := range m.Parts {
			if p := &m.Parts[i]; p.Type == "tool-call" && p.ID == callID {
				p.State, p.Raw = "approval-requested", nil
				p.Approval = &Approval{ID: approvalID, NeedsApproval: true}
				return
			}
		}
	})
}

func (b *builder) runError(e *event) {
	b.hasError = true
	id, _ := e.str("runId")
	if id == "" {
		if t, ok := asString(e.tanstack("runId")); ok {
			id = t
		}
	}
	if id != "" {
		remove(&b.activeRuns, id)
	} else {
		b.activeRuns = nil
	}
	b.ensureAssistantMessage(opt{})
}

// finalizeStream completes what is open, and drops a last assistant message
// whose parts are all whitespace text.
func (b *builder) finalizeStream() {
	b.isDone = true
	var last opt
	for _, id := range append([]string(nil), b.activeMessageIDs...) {
		st := b.state(id)
		if st == nil {
			continue
		}
		b.completeAllToolCallsForMessage(id)
		if st.pending() {
			b.emitTextUpdate(id)
		}
		st.isComplete = true
		if m := b.find(id); m != nil && m.Role == "assistant" {
			last = some(id)
		}
	}
	b.activeMessageIDs = nil
	if last.ok && !b.hasError {
		if m := b.find(last.s); m != nil && whitespaceOnly(*m) {
			kept := b.msgs[:0]
			for _, m := range b.msgs {
				if m.ID != last.s {
					kept = append(kept, m)
				}
			}
			b.msgs = kept
		}
	}
}

func whitespaceOnly(m Message) bool {
	if len(m.Parts) == 0 {
		return false
	}
	for _, p := range m.Parts {
		if p.Type != "text" || strings.TrimFunc(p.text(), jsSpace) != "" {
			return false
		}
	}
	return true
}

// jsSpace is JavaScript's WhiteSpace and LineTerminator (String.prototype.trim).
func jsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// --- reasoning

func (b *builder) stepStarted(e *event) {
	step, _ := e.str("stepName")
	if step == "" {
		step = b.mint("s")
	}
	if active := b.activeAssistantID(); active.truthy() {
		if st := b.state(active.s); st != nil {
			st.currentThinkingStepID = some(step)
			st.addStep(step, "")
			b.pendingThinkingID = ""
			return
		}
	}
	b.pendingThinkingID = step
}

func (b *builder) stepFinished(e *event) {
	sig, _ := e.str("signature")
	if sig == "" {
		return
	}
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	step := st.currentThinkingStepID
	if !step.ok {
		step.s, step.ok = e.str("stepId")
	}
	if !step.truthy() {
		return
	}
	thinking, ok := st.thinkingSteps[step.s]
	if !ok {
		return
	}
	st.thinkingStepSignatures[step.s] = sig
	b.updateThinkingPart(id, step.s, thinking, sig)
}

func (b *builder) reasoningContent(e *event) {
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	delta, _ := e.str("delta")
	if b.pendingThinkingID != "" {
		st.currentThinkingStepID = some(b.pendingThinkingID)
		st.addStep(b.pendingThinkingID, "")
		b.pendingThinkingID = ""
	}
	step := st.currentThinkingStepID.s
	if !st.currentThinkingStepID.ok {
		step, _ = e.str("messageId")
	}
	if _, ok := st.thinkingSteps[step]; !ok {
		st.thinkingSteps[step] = ""
		st.currentThinkingStepID = some(step)
	}
	st.thinkingSteps[step] += delta
	b.updateThinkingPart(id, step, st.thinkingSteps[step], st.thinkingStepSignatures[step])
}

func (b *builder) encryptedValue(e *event) {
	value, _ := e.str("encryptedValue")
	if value == "" {
		return
	}
	entity, _ := e.str("entityId")
	if sub, _ := e.str("subtype"); sub == "tool-call" {
		b.attachToolCallSignature(entity, value)
		return
	}
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	step := st.currentThinkingStepID.s
	if !st.currentThinkingStepID.ok {
		step = entity
	}
	st.thinkingStepSignatures[step] = value
	st.addStep(step, "")
	b.updateThinkingPart(id, step, st.thinkingSteps[step], value)
}

func (b *builder) attachToolCallSignature(callID, sig string) {
	with := func(md json.RawMessage) json.RawMessage {
		m := map[string]json.RawMessage{}
		if isObject(md) {
			m = object(md)
		}
		m["thoughtSignature"] = mustJSON(sig)
		return mustJSON(m)
	}
	for i := range b.msgs {
		for j := range b.msgs[i].Parts {
			if p := &b.msgs[i].Parts[j]; p.Type == "tool-call" && p.ID == callID {
				p.Metadata, p.Raw = with(p.Metadata), nil
			}
		}
	}
	for _, st := range b.states {
		if tc := st.toolCalls[callID]; tc != nil {
			tc.metadata = with(tc.metadata)
		}
	}
}

func (b *builder) updateThinkingPart(id, step, content, sig string) {
	s := step
	p := Part{Type: "thinking", Content: content, StepID: &s, Signature: sig}
	b.each(id, func(m *Message) {
		for i := range m.Parts {
			if q := m.Parts[i]; q.Type == "thinking" && q.StepID != nil && *q.StepID == step {
				m.Parts[i] = p
				return
			}
		}
		m.Parts = append(m.Parts, p)
	})
}

// --- custom events

func (b *builder) custom(e *event) {
	name, _ := e.str("name")
	if name != "approval-requested" {
		return
	}
	v := object(e.raw("value"))
	if v == nil {
		return
	}
	callID, _ := asString(v["toolCallId"])
	approvalID, _ := asString(object(v["approval"])["id"])
	target := b.activeAssistantID()
	if !target.ok {
		if id, ok := b.toolCallToMessage[callID]; ok {
			target = some(id)
		}
	}
	if target.truthy() {
		b.updateToolCallApproval(target.s, callID, approvalID)
	}
}

// --- MESSAGES_SNAPSHOT

// messagesSnapshot replaces the messages with the snapshot's (handleMessagesSnapshotEvent):
// each converted as aguiSnapshotMessageToUIMessage does, thinking-only messages folded into
// the next assistant, tool results anchored into the message of their call, calls given
// their results' output, and a message without metadata keeping the one it had.
func (b *builder) messagesSnapshot(e *event) {
	b.prepareAssistantMessage()
	var list []json.RawMessage
	_ = json.Unmarshal(e.raw("messages"), &list)
	prev := b.msgs
	next := make([]Message, 0, len(list))
	for _, raw := range list {
		next = append(next, b.snapshotMessage(object(raw)))
	}
	next = b.reconcileSnapshotToolCalls(mergeReasoningFanOut(next), prev)
	for i := range next {
		if next[i].Metadata != nil {
			continue
		}
		for j := len(prev) - 1; j >= 0; j-- {
			if prev[j].ID == next[i].ID {
				next[i].Metadata = prev[j].Metadata
				break
			}
		}
	}
	b.msgs = next
}

// snapshotMessage converts one AG-UI message (aguiSnapshotMessageToUIMessage). Not ported:
// messages that carry "parts", "name", tanstack.toolResult ownership, structured output and
// ui resources.
func (b *builder) snapshotMessage(m map[string]json.RawMessage) Message {
	id, _ := asString(m["id"])
	if id == "" {
		id = b.mint("a")
	}
	role, _ := asString(m["role"])
	out := Message{ID: id, Role: "assistant", Parts: []Part{}}
	content := m["content"]
	switch role {
	case "user":
		out.Role = "user"
		if s, ok := asString(content); ok {
			if s != "" {
				out.Parts = append(out.Parts, Part{Type: "text", Content: s})
			}
		} else {
			out.Parts = append(out.Parts, userParts(content)...)
		}
	case "assistant":
		out.Parts = append(out.Parts, contentParts(content)...)
		var callMetadata map[string]json.RawMessage
		if t := tanstackOf(m); t != nil && isObject(t["toolCallMetadata"]) {
			callMetadata = object(t["toolCallMetadata"])
		}
		var calls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		_ = json.Unmarshal(m["toolCalls"], &calls)
		for _, c := range calls {
			out.Parts = append(out.Parts, Part{Type: "tool-call", ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments,
				State: "input-complete", Input: parseJSON(c.Function.Arguments), Metadata: callMetadata[c.ID]})
		}
	case "tool":
		if md := m["metadata"]; !nullish(md) {
			out.Metadata = md
		}
		callID, _ := asString(m["toolCallId"])
		if callID == "" {
			out.Parts = append(out.Parts, contentParts(content)...)
		} else {
			p := Part{Type: "tool-result", ToolCallID: callID, State: "complete"}
			if s, ok := asString(content); ok {
				p.Content = s
			} else if len(content) > 0 && content[0] == '[' {
				p.ContentParts = content
			}
			if rid, ok := asString(m["id"]); ok {
				p.ID = rid
			}
			p.Metadata = out.Metadata
			if errv, ok := m["error"]; ok {
				p.State = "error"
				p.Error, _ = asString(errv)
			}
			out.Parts = append(out.Parts, p)
		}
	case "system", "developer":
		out.Role = "system"
		if s, _ := asString(content); s != "" {
			out.Parts = append(out.Parts, Part{Type: "text", Content: s})
		}
	case "reasoning":
		sig, _ := asString(m["encryptedValue"])
		if sig == "" {
			if t := tanstackOf(m); t != nil {
				sig, _ = asString(t["signature"])
			}
		}
		text, _ := asString(content)
		if text != "" || sig != "" {
			out.Parts = append(out.Parts, Part{Type: "thinking", Content: text, Signature: sig})
		}
	}
	// applySnapshotMetadata
	if md := m["metadata"]; isObject(md) {
		out.Metadata = md
		if t := tanstackOf(object(md)); t != nil {
			out.CreatedAt = coerceCreatedAt(t["createdAt"])
		}
	}
	return out
}

// contentParts is modelMessageToUIMessage's parts of a content: an array's
// parts verbatim, else a text part of a non-empty string.
func contentParts(content json.RawMessage) []Part {
	if len(content) > 0 && content[0] == '[' {
		var list []json.RawMessage
		_ = json.Unmarshal(content, &list)
		parts := make([]Part, 0, len(list))
		for _, p := range list {
			typ, _ := asString(object(p)["type"])
			parts = append(parts, Part{Type: typ, Raw: p})
		}
		return parts
	}
	if s, _ := asString(content); s != "" {
		return []Part{{Type: "text", Content: s}}
	}
	return nil
}

func thinkingOnly(m Message) bool {
	if m.Role != "assistant" || len(m.Parts) == 0 {
		return false
	}
	for _, p := range m.Parts {
		if p.Type != "thinking" {
			return false
		}
	}
	return true
}

func toolResultOnly(m Message) bool {
	if m.Role != "assistant" {
		return false
	}
	results := 0
	for _, p := range m.Parts {
		switch p.Type {
		case "tool-result":
			results++
		case "ui-resource":
		default:
			return false
		}
	}
	return results > 0
}

// mergeReasoningFanOut folds leading thinking-only messages into the next
// assistant message that is not a tool-result-only one.
func mergeReasoningFanOut(msgs []Message) []Message {
	var out, pending []Message
	for _, m := range msgs {
		if thinkingOnly(m) {
			pending = append(pending, m)
			continue
		}
		if m.Role == "assistant" && len(pending) > 0 && !toolResultOnly(m) {
			var parts []Part
			for _, p := range pending {
				parts = append(parts, p.Parts...)
			}
			m.Parts = append(parts, m.Parts...)
			out = append(out, m)
			pending = nil
			continue
		}
		out = append(out, pending...)
		pending = nil
		out = append(out, m)
	}
	return append(out, pending...)
}

func (b *builder) reconcileSnapshotToolCalls(snapshot, prev []Message) []Message {
	prevCalls := map[string]Part{}
	for _, m := range prev {
		for _, p := range m.Parts {
			if p.Type == "tool-call" {
				prevCalls[p.ID] = p
			}
		}
	}
	snapshotCalls := map[string]bool{}
	for _, m := range snapshot {
		for _, p := range m.Parts {
			if p.Type == "tool-call" {
				snapshotCalls[p.ID] = true
			}
		}
	}
	out := []Message{}
	for _, m := range snapshot {
		var result *Part
		if m.Role == "assistant" && toolResultOnly(m) {
			for i := range m.Parts {
				if m.Parts[i].Type == "tool-result" {
					if result != nil {
						result = nil
						break
					}
					result = &m.Parts[i]
				}
			}
		}
		if result == nil {
			out = append(out, m)
			continue
		}
		target := -1
		for i := len(out) - 1; i >= 0 && target < 0; i-- {
			for _, p := range out[i].Parts {
				if p.Type == "tool-call" && p.ID == result.ToolCallID {
					target = i
					break
				}
			}
		}
		for i := len(out) - 1; i >= 0 && target < 0; i-- {
			if out[i].Role == "assistant" && !(len(out[i].Parts) == 1 && out[i].Parts[0].Type == "tool-result") {
				target = i
			}
		}
		if target < 0 {
			out = append(out, m)
			continue
		}
		parts := append([]Part(nil), out[target].Parts...)
		has := false
		for _, p := range parts {
			if p.Type == "tool-call" && p.ID == result.ToolCallID {
				has = true
			}
		}
		if !snapshotCalls[result.ToolCallID] && !has {
			if p, ok := prevCalls[result.ToolCallID]; ok {
				parts = append(parts, p)
				snapshotCalls[p.ID] = true
			}
		}
		out[target].Parts = append(parts, m.Parts...)
	}
	return enrichSnapshotToolCalls(out, prevCalls)
}

// enrichSnapshotToolCalls gives calls the output and state of their pre-snapshot
// part, or of their tool-result part.
func enrichSnapshotToolCalls(msgs []Message, prevCalls map[string]Part) []Message {
	results := map[string]Part{}
	for _, m := range msgs {
		for _, p := range m.Parts {
			if p.Type == "tool-result" {
				results[p.ToolCallID] = p
			}
		}
	}
	for i := range msgs {
		for j := range msgs[i].Parts {
			p := &msgs[i].Parts[j]
			if p.Type != "tool-call" {
				continue
			}
			p.Raw = nil
			if prev, ok := prevCalls[p.ID]; ok && (prev.Output != nil || prev.State == "complete" || prev.State == "error") &&
				(p.Output == nil || p.State == "input-complete" || p.State == "input-streaming" || p.State == "awaiting-input") {
				if prev.Output != nil {
					p.Output = prev.Output
				}
				p.State = prev.State
				if prev.Approval != nil {
					a := *prev.Approval
					p.Approval = &a
				}
				if prev.Metadata != nil {
					p.Metadata = prev.Metadata
				}
			}
			r, ok := results[p.ID]
			if !ok || p.Output != nil {
				continue
			}
			output := r.ContentParts
			if output == nil {
				if output = parseJSON(r.Content); output == nil {
					output = mustJSON(r.Content)
				}
			}
			if r.State == "error" {
				p.Output = mustJSON(map[string]string{"error": toolResultError(output)})
				p.State = "error"
			} else {
				p.Output = output
				p.State = "complete"
			}
		}
	}
	return msgs
}

// addOnce appends id to the set *ids unless it is there.
func addOnce(ids *[]string, id string) {
	if !slices.Contains(*ids, id) {
		*ids = append(*ids, id)
	}
}

// remove takes id out of the set *ids.
func remove(ids *[]string, id string) {
	if i := slices.Index(*ids, id); i >= 0 {
		*ids = slices.Delete(*ids, i, i+1)
	}
}
