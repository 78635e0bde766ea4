package protocol

import (
	"bytes"
	"strconv"
	"strings"
)

// This file ports verifyEvents of @ag-ui/client 1.0.0 (AGUI-1.0.md section 3).

// ViolationError is a rejection by chunk expansion or sequence verification.
// Its Error is exactly the @ag-ui/client message.
type ViolationError struct {
	Message string
}

func (e *ViolationError) Error() string { return e.Message }

// violation builds a ViolationError. Ids that hold lone surrogates keep them
// in their generalized UTF-8 form; appendString encodes them back as \uXXXX.
func violation(msg string) error { return &ViolationError{Message: msg} }

func itoa(n int) string { return strconv.Itoa(n) }

// owner is the recorded owner of an entity: the parent agent or a subagent.
type owner struct {
	sub bool
	id  string
}

func (o owner) String() string {
	if !o.sub {
		return "(the parent agent)"
	}
	return o.id
}

func ownerOf(t tag) owner {
	if t.state == tagValue {
		return owner{sub: true, id: t.id}
	}
	return owner{}
}

// orderedSet is a set of ids that remembers insertion order.
type orderedSet struct {
	idx  map[string]int
	keys []string
	live int
}

func (s *orderedSet) has(k string) bool {
	_, ok := s.idx[k]
	return ok
}

func (s *orderedSet) add(k string) {
	if s.idx == nil {
		s.idx = make(map[string]int)
	}
	if _, ok := s.idx[k]; ok {
		return
	}
	s.idx[k] = len(s.keys)
	s.keys = append(s.keys, k)
	s.live++
}

func (s *orderedSet) remove(k string) {
	i, ok := s.idx[k]
	if !ok {
		return
	}
	delete(s.idx, k)
	s.keys[i] = "\x00removed"
	s.live--
	if s.live == 0 {
		s.keys = s.keys[:0]
	}
}

func (s *orderedSet) list() []string {
	out := make([]string, 0, s.live)
	for i, k := range s.keys {
		if j, ok := s.idx[k]; ok && j == i {
			out = append(out, k)
		}
	}
	return out
}

// stepOwner holds the open steps of one owner.
type stepOwner struct {
	o     owner
	names orderedSet
}

// verifier is the state of verifyEvents.
type verifier struct {
	runStarted, runFinished, runError, firstEvent bool

	text, tools, spans, reasoning orderedSet

	msgOwner, toolOwner, activityOwner, reasoningOwner map[string]owner

	steps []*stepOwner

	activeSubs orderedSet
	closedSubs map[string]bool
}

func (v *verifier) reset() {
	*v = verifier{firstEvent: v.firstEvent}
}

func setOwner(m *map[string]owner, id string, o owner) {
	if *m == nil {
		*m = make(map[string]owner)
	}
	(*m)[id] = o
}

func setOwnerIfNew(m *map[string]owner, id string, o owner) {
	if _, ok := (*m)[id]; ok {
		return
	}
	setOwner(m, id, o)
}

func optional(t EventType, field string) error {
	return violation("Cannot send '" + string(t) + "' with '" + field + ": null'. The field is optional — omit it entirely.")
}

// tagError reports an owner mismatch (section 3.3).
func tagError(t EventType, tg tag, kind, id string, m map[string]owner) error {
	if tg.state != tagValue {
		return nil
	}
	o, ok := m[id]
	if !ok || (o.sub && o.id == tg.id) {
		return nil
	}
	return violation("Cannot send '" + string(t) + "': subagentRunId '" + tg.id + "' does not match the " + kind + " '" + id + "' opener's subagent '" + o.String() + "'.")
}

// push verifies one expanded event.
func (v *verifier) push(e *Event) error {
	t := e.typ
	// Checks before the per-type switch (section 3.2).
	if v.runError && t != RunStarted {
		return violation("Cannot send event type '" + string(t) + "': The run has already errored with 'RUN_ERROR'. No further events can be sent.")
	}
	if v.runFinished && t != RunError && t != RunStarted {
		return violation("Cannot send event type '" + string(t) + "': The run has already finished with 'RUN_FINISHED'. Start a new run with 'RUN_STARTED'.")
	}
	if !v.firstEvent {
		if t != RunStarted && t != RunError {
			return violation("First event must be 'RUN_STARTED'")
		}
		v.firstEvent = true
	}
	if t == RunStarted {
		if v.runStarted && !v.runFinished && !v.runError {
			return violation("Cannot send 'RUN_STARTED' while a run is still active. The previous run must be finished with 'RUN_FINISHED' before starting a new run.")
		}
		if v.runFinished || v.runError {
			v.reset()
		}
	}
	tg := readTag(e.m)
	if tg.state == tagNull {
		return optional(t, "subagentRunId")
	}
	if err := v.preSubagent(e); err != nil {
		return err
	}

	id := func(key string) string { return unquote(lookup(e.m, key)) }
	// Hot path: content and end events of open entities, looked up without allocating.
	switch t {
	case TextMessageContent, ToolCallArgs, ReasoningMessageContent:
		set, owners := &v.text, v.msgOwner
		kind := "message"
		switch t {
		case ToolCallArgs:
			set, owners, kind = &v.tools, v.toolOwner, "tool call"
		case ReasoningMessageContent:
			set, owners, kind = &v.reasoning, v.reasoningOwner, "reasoning message"
		}
		key := "messageId"
		if t == ToolCallArgs {
			key = "toolCallId"
		}
		if raw := lookup(e.m, key); isString(raw) && bytes.IndexByte(raw, '\\') < 0 {
			body := raw[1 : len(raw)-1]
			if _, open := set.idx[string(body)]; open {
				if o, ok := owners[string(body)]; !ok || tg.state != tagValue || (o.sub && o.id == tg.id) {
					return nil
				}
				return tagError(t, tg, kind, string(body), owners)
			}
		}
	}
	switch t {
	case RunStarted:
		v.runStarted = true
		if in := lookup(e.m, "input"); isObject(in) {
			if err := v.seed(lookup(splitObject(in, nil), "messages"), false); err != nil {
				return err
			}
		}
	case RunFinished:
		if err := v.finish(); err != nil {
			return err
		}
		v.runFinished = true
	case RunError:
		v.runError = true
	case MessagesSnapshot:
		return v.seed(lookup(e.m, "messages"), true)

	case TextMessageStart:
		mid := id("messageId")
		if v.text.has(mid) {
			return violation("Cannot send 'TEXT_MESSAGE_START' event: A text message with ID '" + mid + "' is already in progress. Complete it with 'TEXT_MESSAGE_END' first.")
		}
		if err := tagError(t, tg, "message", mid, v.msgOwner); err != nil {
			return err
		}
		v.text.add(mid)
		setOwnerIfNew(&v.msgOwner, mid, ownerOf(tg))
	case TextMessageContent, TextMessageEnd:
		mid := id("messageId")
		if !v.text.has(mid) {
			if t == TextMessageContent {
				return violation("Cannot send 'TEXT_MESSAGE_CONTENT' event: No active text message found with ID '" + mid + "'. Start a text message with 'TEXT_MESSAGE_START' first.")
			}
			return violation("Cannot send 'TEXT_MESSAGE_END' event: No active text message found with ID '" + mid + "'. A 'TEXT_MESSAGE_START' event must be sent first.")
		}
		if err := tagError(t, tg, "message", mid, v.msgOwner); err != nil {
			return err
		}
		if t == TextMessageEnd {
			v.text.remove(mid)
		}

	case ToolCallStart:
		cid := id("toolCallId")
		if v.tools.has(cid) {
			return violation("Cannot send 'TOOL_CALL_START' event: A tool call with ID '" + cid + "' is already in progress. Complete it with 'TOOL_CALL_END' first.")
		}
		pv := lookup(e.m, "parentMessageId")
		pid := unquote(pv)
		pOwner, hasP := owner{}, false
		if isString(pv) {
			pOwner, hasP = v.msgOwner[pid]
		}
		if hasP && tg.state == tagValue && pOwner != ownerOf(tg) {
			return violation("Cannot send 'TOOL_CALL_START': subagentRunId '" + tg.id + "' does not match its parent message '" + pid + "' owner '" + pOwner.String() + "'. A tool call belongs to the message that carries it.")
		}
		if cOwner, ok := v.toolOwner[cid]; ok {
			if err := tagError(t, tg, "tool call", cid, v.toolOwner); err != nil {
				return err
			}
			if tg.state != tagValue && hasP && pOwner != cOwner {
				return violation("Cannot send 'TOOL_CALL_START': tool call '" + cid + "' is owned by '" + cOwner.String() + "' but its parent message '" + pid + "' is owned by '" + pOwner.String() + "'. A tool call belongs to the message that carries it.")
			}
		}
		v.tools.add(cid)
		o := ownerOf(tg)
		if tg.state != tagValue && hasP {
			o = pOwner
		}
		setOwnerIfNew(&v.toolOwner, cid, o)
	case ToolCallArgs, ToolCallEnd:
		cid := id("toolCallId")
		if !v.tools.has(cid) {
			if t == ToolCallArgs {
				return violation("Cannot send 'TOOL_CALL_ARGS' event: No active tool call found with ID '" + cid + "'. Start a tool call with 'TOOL_CALL_START' first.")
			}
			return violation("Cannot send 'TOOL_CALL_END' event: No active tool call found with ID '" + cid + "'. A 'TOOL_CALL_START' event must be sent first.")
		}
		if err := tagError(t, tg, "tool call", cid, v.toolOwner); err != nil {
			return err
		}
		if t == ToolCallEnd {
			v.tools.remove(cid)
		}
	case ToolCallResult:
		setOwner(&v.msgOwner, id("messageId"), ownerOf(tg))

	case StepStarted:
		name := id("stepName")
		so := v.stepsOf(ownerOf(tg), true)
		if so.names.has(name) {
			msg := "Step \"" + name + "\" is already active for 'STEP_STARTED'"
			if tg.state == tagValue {
				msg += " in subagent '" + tg.id + "'"
			}
			return violation(msg)
		}
		so.names.add(name)
	case StepFinished:
		name := id("stepName")
		o := ownerOf(tg)
		if so := v.stepsOf(o, false); so != nil && so.names.has(name) {
			so.names.remove(name)
			break
		}
		for _, other := range v.steps {
			if other.o != o && other.names.has(name) {
				return violation("Cannot send 'STEP_FINISHED' for step \"" + name + "\" attributed to " + describe(o) + ": that step is open under " + describe(other.o) + ". A step must be finished by whoever started it.")
			}
		}
		return violation("Cannot send 'STEP_FINISHED' for step \"" + name + "\" that was not started")

	case ActivitySnapshot:
		aid := id("messageId")
		_, known := v.activityOwner[aid]
		if r := lookup(e.m, "replace"); !known || string(r) != "false" {
			setOwner(&v.activityOwner, aid, ownerOf(tg))
		}
	case ActivityDelta:
		return tagError(t, tg, "activity", id("messageId"), v.activityOwner)

	case ReasoningStart:
		rid := id("messageId")
		if v.spans.has(rid) {
			return violation("Cannot send 'REASONING_START' event: A reasoning span with ID '" + rid + "' is already in progress. Complete it with 'REASONING_END' first.")
		}
		if err := tagError(t, tg, "reasoning message", rid, v.reasoningOwner); err != nil {
			return err
		}
		v.spans.add(rid)
		setOwnerIfNew(&v.reasoningOwner, rid, ownerOf(tg))
	case ReasoningMessageStart:
		rid := id("messageId")
		if v.reasoning.has(rid) {
			return violation("Cannot send 'REASONING_MESSAGE_START' event: A reasoning message with ID '" + rid + "' is already in progress. Complete it with 'REASONING_MESSAGE_END' first.")
		}
		if err := tagError(t, tg, "reasoning message", rid, v.reasoningOwner); err != nil {
			return err
		}
		v.reasoning.add(rid)
		setOwnerIfNew(&v.reasoningOwner, rid, ownerOf(tg))
	case ReasoningMessageContent, ReasoningMessageEnd:
		rid := id("messageId")
		if !v.reasoning.has(rid) {
			return violation("Cannot send '" + string(t) + "' event: No active reasoning message found with ID '" + rid + "'. Start a reasoning message with 'REASONING_MESSAGE_START' first.")
		}
		if err := tagError(t, tg, "reasoning message", rid, v.reasoningOwner); err != nil {
			return err
		}
		if t == ReasoningMessageEnd {
			v.reasoning.remove(rid)
		}
	case ReasoningEnd:
		rid := id("messageId")
		if !v.spans.has(rid) {
			return violation("Cannot send 'REASONING_END' event: No active reasoning span found with ID '" + rid + "'. A 'REASONING_START' event must be sent first.")
		}
		if err := tagError(t, tg, "reasoning message", rid, v.reasoningOwner); err != nil {
			return err
		}
		v.spans.remove(rid)
	case ReasoningEncryptedValue:
		eid := id("entityId")
		switch id("subtype") {
		case "tool-call":
			return tagError(t, tg, "tool call", eid, v.toolOwner)
		case "message":
			if _, ok := v.msgOwner[eid]; ok {
				return tagError(t, tg, "message", eid, v.msgOwner)
			}
			return tagError(t, tg, "message", eid, v.reasoningOwner)
		default: // only reachable without the schema
			return tagError(t, tg, "reasoning message", eid, v.reasoningOwner)
		}

	case SubagentStarted:
		sv := lookup(e.m, "subagentRunId")
		if !isString(sv) {
			return violation("Cannot send 'SUBAGENT_STARTED' without a 'subagentRunId'.")
		}
		if !isString(lookup(e.m, "name")) {
			return violation("Cannot send 'SUBAGENT_STARTED' without a 'name'.")
		}
		sid := unquote(sv)
		if v.activeSubs.has(sid) {
			return violation("Cannot send 'SUBAGENT_STARTED': subagent '" + sid + "' is already active. Finish it with 'SUBAGENT_FINISHED' first.")
		}
		if v.closedSubs[sid] {
			return violation("Cannot send 'SUBAGENT_STARTED': subagent '" + sid + "' has already finished in this run. Subagent IDs are per-invocation and cannot be reused.")
		}
		if p := lookup(e.m, "parentSubagentRunId"); isString(p) {
			ps := unquote(p)
			if !v.activeSubs.has(ps) && !v.closedSubs[ps] {
				return violation("Cannot send 'SUBAGENT_STARTED': parentSubagentRunId '" + ps + "' has not been started in this run.")
			}
		}
		v.activeSubs.add(sid)
	case SubagentFinished, SubagentError:
		sv := lookup(e.m, "subagentRunId")
		if !isString(sv) {
			return violation("Cannot send '" + string(t) + "' without a 'subagentRunId'.")
		}
		if t == SubagentError && !isString(lookup(e.m, "message")) {
			return violation("Cannot send 'SUBAGENT_ERROR' without a 'message'.")
		}
		sid := unquote(sv)
		if !v.activeSubs.has(sid) {
			return violation("Cannot send '" + string(t) + "': no active subagent found with ID '" + sid + "'. A 'SUBAGENT_STARTED' event must be sent first.")
		}
		v.activeSubs.remove(sid)
		if v.closedSubs == nil {
			v.closedSubs = make(map[string]bool)
		}
		v.closedSubs[sid] = true
	}
	return nil
}

func describe(o owner) string {
	if !o.sub {
		return "the parent agent"
	}
	return "subagent '" + o.id + "'"
}

func (v *verifier) stepsOf(o owner, create bool) *stepOwner {
	for _, so := range v.steps {
		if so.o == o {
			return so
		}
	}
	if !create {
		return nil
	}
	so := &stepOwner{o: o}
	v.steps = append(v.steps, so)
	return so
}

// preSubagent runs checks 6 to 10 of section 3.2.
func (v *verifier) preSubagent(e *Event) error {
	t := e.typ
	switch t {
	case SubagentStarted, SubagentFinished, SubagentError:
		var nullable []string
		switch t {
		case SubagentStarted:
			nullable = []string{"description", "parentSubagentRunId", "parentToolCallId", "parentMessageId"}
		case SubagentFinished:
			nullable = []string{"outcome"}
		default:
			nullable = []string{"code"}
		}
		for _, f := range nullable {
			if isNull(lookup(e.m, f)) {
				return optional(t, f)
			}
		}
		oc := lookup(e.m, "outcome")
		if oc == nil || isNull(oc) {
			return nil
		}
		var oms []member
		if isObject(oc) {
			oms = splitObject(oc, nil)
		}
		ot := lookup(oms, "type")
		if s := unquote(ot); !isString(ot) || (s != "success" && s != "suspended") {
			return violation("Cannot send '" + string(t) + "' with outcome type '" + jsText(ot) + "'. The outcome is either { type: \"success\" } or { type: \"suspended\" }.")
		}
		ids := lookup(oms, "interruptIds")
		if isNull(ids) {
			return violation("Cannot send '" + string(t) + "' with 'outcome.interruptIds: null'. The field is optional — omit it entirely.")
		}
		if isArray(ids) {
			for _, el := range splitArray(ids, nil) {
				if !isString(el) {
					return violation("Cannot send '" + string(t) + "' with a non-string entry in 'outcome.interruptIds'. Interrupt ids are strings.")
				}
			}
		}
	case RunFinished:
		oc := lookup(e.m, "outcome")
		if !isObject(oc) {
			return nil
		}
		oms := splitObject(oc, nil)
		if unquote(lookup(oms, "type")) != "interrupt" {
			return nil
		}
		for _, in := range splitArray(lookup(oms, "interrupts"), nil) {
			if !isObject(in) {
				continue
			}
			ims := splitObject(in, nil)
			if isNull(lookup(ims, "subagentRunId")) {
				return violation("Cannot send 'RUN_FINISHED' with an interrupt (id '" + jsText(lookup(ims, "id")) + "') carrying 'subagentRunId: null'. The field is optional — omit it entirely.")
			}
		}
	}
	return nil
}

// seed records owners from messages (section 3.3, ownership seeding).
func (v *verifier) seed(msgs []byte, authoritative bool) error {
	if !isArray(msgs) {
		return nil
	}
	put := func(m *map[string]owner, id string, o owner) {
		if authoritative {
			setOwner(m, id, o)
		} else {
			setOwnerIfNew(m, id, o)
		}
	}
	for _, raw := range splitArray(msgs, nil) {
		if !isObject(raw) {
			continue
		}
		ms := splitObject(raw, nil)
		idv := lookup(ms, "id")
		if !isString(idv) {
			continue
		}
		mid := unquote(idv)
		tg := readTag(ms)
		if tg.state == tagNull {
			return violation("Cannot send a message (id '" + mid + "') with 'subagentRunId: null'. The field is optional — omit it entirely.")
		}
		o := ownerOf(tg)
		switch unquote(lookup(ms, "role")) {
		case "reasoning":
			put(&v.reasoningOwner, mid, o)
		case "activity":
			put(&v.activityOwner, mid, o)
		default:
			put(&v.msgOwner, mid, o)
		}
		for _, tc := range splitArray(lookup(ms, "toolCalls"), nil) {
			if isObject(tc) {
				if tid := lookup(splitObject(tc, nil), "id"); isString(tid) {
					put(&v.toolOwner, unquote(tid), o)
				}
			}
		}
	}
	return nil
}

// finish runs the RUN_FINISHED open-entity checks in their order.
func (v *verifier) finish() error {
	const prefix = "Cannot send 'RUN_FINISHED' while "
	var steps []string
	for _, so := range v.steps {
		for _, n := range so.names.list() {
			if so.o.sub {
				n += " (subagent '" + so.o.id + "')"
			}
			steps = append(steps, n)
		}
	}
	if len(steps) > 0 {
		return violation(prefix + "steps are still active: " + strings.Join(steps, ", "))
	}
	for _, c := range []struct {
		what string
		set  *orderedSet
	}{
		{"text messages", &v.text},
		{"reasoning messages", &v.reasoning},
		{"reasoning spans", &v.spans},
		{"tool calls", &v.tools},
		{"subagents", &v.activeSubs},
	} {
		if c.set.live > 0 {
			return violation(prefix + c.what + " are still active: " + strings.Join(c.set.list(), ", "))
		}
	}
	return nil
}
