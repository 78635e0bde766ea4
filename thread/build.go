package thread

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/wsgateway/wsgateway/protocol"
)

// This file and its siblings (collections.go, toolcalls.go, runs.go, reasoning.go,
// snapshot.go: one part of the builder each) port StreamProcessor of @tanstack/ai 0.58.0
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
	noMetadata        bool              // events' metadata is not merged (FinishContext)
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
	if b.noMetadata || !isObject(incoming) {
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
