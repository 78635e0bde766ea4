package protocol

// This file ports transformChunks of @ag-ui/client 1.0.0 (AGUI.md section 2).

// tag is a subagentRunId as read from an event: absent, null, or a value
// (a string on every schema-checked event that declares it).
type tag struct {
	state tagState
	id    string
	raw   []byte // the encoded value, when present
}

type tagState uint8

const (
	tagAbsent tagState = iota
	tagNull
	tagValue
)

func readTag(ms []member) tag {
	v := lookup(ms, "subagentRunId")
	switch {
	case v == nil:
		return tag{}
	case isNull(v):
		return tag{state: tagNull, raw: v}
	case isString(v):
		return tag{state: tagValue, id: unquote(v), raw: v}
	}
	return tag{state: tagValue, id: string(v), raw: v}
}

// lane names a chunk lane: the parent agent, or one subagentRunId.
type lane struct {
	sub bool
	id  string
}

func (t tag) lane() lane {
	if t.state == tagValue {
		return lane{sub: true, id: t.id}
	}
	return lane{}
}

func (l lane) owner() string {
	if !l.sub {
		return "(the parent agent)"
	}
	return l.id
}

type chunkKind uint8

const (
	kindText chunkKind = iota + 1
	kindTool
	kindReasoning
)

type kindInfo struct {
	chunk       EventType
	start, body EventType
	end         EventType
	idKey       string
	label       string
	declared    map[string]bool
}

// kinds describes each chunk kind, indexed by it.
var kinds = [...]*kindInfo{
	kindText: {
		chunk: TextMessageChunk, start: TextMessageStart, body: TextMessageContent, end: TextMessageEnd,
		idKey: "messageId", label: "text message",
		declared: declared("messageId", "role", "delta", "name"),
	},
	kindTool: {
		chunk: ToolCallChunk, start: ToolCallStart, body: ToolCallArgs, end: ToolCallEnd,
		idKey: "toolCallId", label: "tool call",
		declared: declared("toolCallId", "toolCallName", "parentMessageId", "delta"),
	},
	kindReasoning: {
		chunk: ReasoningMessageChunk, start: ReasoningMessageStart, body: ReasoningMessageContent, end: ReasoningMessageEnd,
		idKey: "messageId", label: "reasoning message",
		declared: declared("messageId", "delta"),
	},
}

func declared(keys ...string) map[string]bool {
	m := map[string]bool{"type": true, "timestamp": true, "rawEvent": true, "metadata": true, "subagentRunId": true}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// stream is the pending chunk stream of one lane.
type stream struct {
	kind   chunkKind
	id     []byte // encoded id
	role   []byte // text: the established role (encoded), never nil
	name   []byte // text: nil when none was established
	tcName []byte // tool
	parent []byte // tool: parentMessageId, nil when none
	opener tag
}

// expander is the state of transformChunks: the pending stream of each lane,
// in the order the streams were opened.
type expander struct {
	lanes []laneStream
}

type laneStream struct {
	lane lane
	s    *stream
}

func (x *expander) get(l lane) *stream {
	for _, ls := range x.lanes {
		if ls.lane == l {
			return ls.s
		}
	}
	return nil
}

var assistantRole = []byte(`"assistant"`)

// push expands one event, appending the results to out.
func (x *expander) push(e *Event, out []*Event) ([]*Event, error) {
	switch e.typ {
	case TextMessageChunk:
		return x.chunk(e, kindText, out)
	case ToolCallChunk:
		return x.chunk(e, kindTool, out)
	case ReasoningMessageChunk:
		return x.chunk(e, kindReasoning, out)
	case RunStarted, RunFinished, RunError, MessagesSnapshot:
		out = x.closeAll(out)
	case SubagentFinished, SubagentError:
		if t := readTag(e.m); t.state == tagValue {
			out = x.close(t.lane(), out)
		}
	case TextMessageStart, TextMessageContent, TextMessageEnd,
		ToolCallStart, ToolCallArgs, ToolCallEnd, ToolCallResult,
		StateSnapshot, StateDelta, Custom, StepStarted, StepFinished,
		ReasoningStart, ReasoningEnd, ReasoningMessageStart, ReasoningMessageContent, ReasoningMessageEnd:
		if len(x.lanes) > 0 {
			out = x.close(readTag(e.m).lane(), out)
		}
	}
	return append(out, e), nil
}

// closeAll ends every lane's stream, in the order the streams were opened.
func (x *expander) closeAll(out []*Event) []*Event {
	for len(x.lanes) > 0 {
		out = x.close(x.lanes[0].lane, out)
	}
	return out
}

// close ends the stream of lane l, if any, with a synthetic END.
func (x *expander) close(l lane, out []*Event) []*Event {
	var s *stream
	for i, ls := range x.lanes {
		if ls.lane == l {
			s = ls.s
			x.lanes = append(x.lanes[:i:i], x.lanes[i+1:]...)
			break
		}
	}
	if s == nil {
		return out
	}
	k := kinds[s.kind]
	ms := []member{mem("type", quoteType(k.end)), mem(k.idKey, s.id)}
	if s.opener.state != tagAbsent {
		ms = append(ms, mem("subagentRunId", s.opener.raw))
	}
	return append(out, eventFromMembers(ms))
}

// endAll returns the synthetic ENDs of the open chunk streams, in the order
// closeAll would emit them, without changing state.
func (x *expander) endAll() []*Event {
	clone := &expander{lanes: append([]laneStream(nil), x.lanes...)}
	return clone.closeAll(nil)
}

// quoteType returns the JSON string token of t, without allocating for the 31 known types.
func quoteType(t EventType) []byte {
	if tok, ok := typeTokens[t]; ok {
		return tok
	}
	return appendString(nil, string(t))
}

var typeTokens = func() map[EventType][]byte {
	m := make(map[EventType][]byte, len(EventTypes))
	for _, t := range EventTypes {
		m[t] = appendString(nil, string(t))
	}
	return m
}()

var (
	emptyString    = []byte(`""`)
	reasoningToken = []byte(`"reasoning"`)
)

// chunk appends to out the events a chunk expands to: the synthetic END of
// the stream it replaces, the START of the stream it opens, and its CONTENT
// or ARGS. Nothing derived from a chunk that fails is emitted.
func (x *expander) chunk(e *Event, kind chunkKind, out []*Event) ([]*Event, error) {
	k := kinds[kind]
	id := lookup(e.m, k.idKey)
	t := readTag(e.m)
	l, err := x.resolve(kind, id, t)
	if err != nil {
		return out, err
	}
	s := x.get(l)
	continued := s != nil && s.kind == kind && (id == nil || eqStr(id, s.id))
	var start []member
	var ends []*Event
	if continued {
		if err := agree(k, s, e.m); err != nil {
			return out, err
		}
	} else {
		if s != nil {
			ends = x.close(l, nil)
		}
		if s, start, err = openStream(kind, id, t, e.m); err != nil {
			return out, err
		}
	}
	unknown := hasUnknown(e.m, k.declared)
	body := contentEvent(k, s, e.m, t, continued, unknown)
	if body == nil && start != nil && unknown {
		// The synthesized fields win a clash (section 2.4, step 4).
		for _, m := range unknownMembers(nil, e.m, k.declared) {
			if lookup(start, m.key) == nil {
				start = append(start, m)
			}
		}
	}
	out = append(out, ends...)
	if start != nil {
		x.lanes = append(x.lanes, laneStream{lane: l, s: s})
		out = append(out, eventFromMembers(start))
	}
	if body != nil {
		out = append(out, body)
	}
	return out, nil
}

// resolve returns the lane of a chunk (section 2.3): the lane whose stream
// has the chunk's id, else the chunk's tag's lane; a chunk with neither id
// nor tag goes to the parent's stream of its kind, else to the one lane with
// a stream of its kind, and is ambiguous when several lanes have one.
func (x *expander) resolve(kind chunkKind, id []byte, t tag) (lane, error) {
	k := kinds[kind]
	if id != nil {
		for _, ls := range x.lanes {
			if ls.s.kind != kind || !eqStr(ls.s.id, id) {
				continue
			}
			if t.state == tagValue && t.lane() != ls.lane {
				return lane{}, violation("Cannot continue " + k.label + " '" + unquote(id) + "': chunk subagentRunId '" + t.id + "' does not match the open stream's subagent '" + ls.lane.owner() + "'.")
			}
			return ls.lane, nil
		}
	}
	if id != nil || t.state == tagValue {
		return t.lane(), nil
	}
	if s := x.get(lane{}); s != nil && s.kind == kind {
		return lane{}, nil
	}
	var only lane
	n := 0
	for _, ls := range x.lanes {
		if ls.s.kind == kind {
			only, n = ls.lane, n+1
		}
	}
	if n > 1 {
		return lane{}, violation("Ambiguous " + string(k.chunk) + ": it carries neither a " + k.idKey + " nor a subagentRunId, but " + itoa(n) + " lanes have an open " + k.label + ". Attribute the chunk to the subagent it belongs to.")
	}
	return only, nil
}

// openStream opens the stream of a chunk that does not continue its lane's
// and returns it with the members of its START (section 2.5). A stream's
// first chunk carries its id, and a tool call's first chunk also its name.
func openStream(kind chunkKind, id []byte, t tag, ms []member) (*stream, []member, error) {
	k := kinds[kind]
	if id == nil {
		return nil, nil, violation("First " + string(k.chunk) + " must have a " + k.idKey)
	}
	s := &stream{kind: kind, id: id, opener: t}
	start := []member{mem("type", quoteType(k.start)), mem(k.idKey, id)}
	switch kind {
	case kindText:
		if s.role = lookup(ms, "role"); s.role == nil {
			s.role = assistantRole
		}
		start = append(start, mem("role", s.role))
		if s.name = lookup(ms, "name"); s.name != nil {
			start = append(start, mem("name", s.name))
		}
	case kindTool:
		if s.tcName = lookup(ms, "toolCallName"); s.tcName == nil {
			return nil, nil, violation("First TOOL_CALL_CHUNK must have a toolCallName")
		}
		start = append(start, mem("toolCallName", s.tcName))
		if s.parent = lookup(ms, "parentMessageId"); s.parent != nil {
			start = append(start, mem("parentMessageId", s.parent))
		}
	case kindReasoning:
		start = append(start, mem("role", reasoningToken))
	}
	if t.state != tagAbsent {
		start = append(start, mem("subagentRunId", t.raw))
	}
	if md := lookup(ms, "metadata"); md != nil {
		start = append(start, mem("metadata", md))
	}
	return s, start, nil
}

// contentEvent returns the CONTENT or ARGS of a chunk in stream s (section 2.4,
// steps 2 and 3), nil when the chunk carries nothing to stream: no delta or
// rawEvent, and for a continuation also no metadata, null tag or unknown key.
func contentEvent(k *kindInfo, s *stream, ms []member, t tag, continued, unknown bool) *Event {
	delta, rawEv, md := lookup(ms, "delta"), lookup(ms, "rawEvent"), lookup(ms, "metadata")
	if delta == nil && rawEv == nil && !(continued && (md != nil || t.state == tagNull || unknown)) {
		return nil
	}
	var buf [8]member
	out := buf[:0]
	if unknown {
		out = unknownMembers(out, ms, k.declared)
	}
	if delta == nil {
		delta = emptyString
	}
	out = append(out, mem("type", quoteType(k.body)), mem(k.idKey, s.id), mem("delta", delta))
	switch {
	case t.state != tagAbsent:
		out = append(out, mem("subagentRunId", t.raw))
	case s.opener.state != tagAbsent:
		out = append(out, mem("subagentRunId", s.opener.raw))
	}
	if md != nil {
		out = append(out, mem("metadata", md))
	}
	if rawEv != nil {
		out = append(out, mem("rawEvent", rawEv))
	}
	return eventFromMembers(out)
}

// hasUnknown reports whether ms has a key the chunk's schema does not declare.
func hasUnknown(ms []member, declared map[string]bool) bool {
	for _, m := range ms {
		if !declared[m.key] {
			return true
		}
	}
	return false
}

// agree checks that a continuation repeats the opener's fields faithfully.
func agree(k *kindInfo, s *stream, ms []member) error {
	check := func(field string, got, established []byte) error {
		if got == nil {
			return nil
		}
		if established != nil && eqStr(got, established) {
			return nil
		}
		msg := "Cannot continue " + k.label + " '" + unquote(s.id) + "': chunk " + field + " '" + jsText(got) + "' does not match the open stream's " + field
		if established == nil {
			return violation(msg + " (absent).")
		}
		return violation(msg + " '" + jsText(established) + "'.")
	}
	switch s.kind {
	case kindText:
		if err := check("role", lookup(ms, "role"), s.role); err != nil {
			return err
		}
		return check("name", lookup(ms, "name"), s.name)
	case kindTool:
		if err := check("toolCallName", lookup(ms, "toolCallName"), s.tcName); err != nil {
			return err
		}
		return check("parentMessageId", lookup(ms, "parentMessageId"), s.parent)
	}
	return nil
}

// eqStr reports whether two encoded JSON values are equal strings (or, for
// other values, equal encodings).
func eqStr(a, b []byte) bool {
	if string(a) == string(b) {
		return true
	}
	if isString(a) && isString(b) {
		return unquote(a) == unquote(b)
	}
	return false
}

// unknownMembers appends the members of ms whose keys are not declared, once
// per key with the last value (as JSON.parse keeps it).
func unknownMembers(dst, ms []member, declared map[string]bool) []member {
	base := len(dst)
next:
	for _, m := range ms {
		if declared[m.key] {
			continue
		}
		for i := base; i < len(dst); i++ {
			if dst[i].key == m.key {
				dst[i].val = m.val
				continue next
			}
		}
		dst = append(dst, m)
	}
	return dst
}
