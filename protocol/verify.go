package protocol

import (
	"bytes"
	"strconv"
	"strings"
)

// This file ports verifyEvents of @ag-ui/client 1.0.0 (AGUI.md section 3).

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

// agrees reports whether tag tg agrees with the owner on record for id in m.
// An untagged event and an id with no owner on record always agree; a
// parent-owned id disagrees with every tag (section 3.3).
func agrees(tg tag, id string, m map[string]owner) bool {
	if tg.state != tagValue {
		return true
	}
	o, ok := m[id]
	return !ok || (o.sub && o.id == tg.id)
}

// tagError reports an owner mismatch (section 3.3).
func tagError(t EventType, tg tag, kind, id string, m map[string]owner) error {
	if agrees(tg, id, m) {
		return nil
	}
	return violation("Cannot send '" + string(t) + "': subagentRunId '" + tg.id + "' does not match the " + kind + " '" + id + "' opener's subagent '" + m[id].String() + "'.")
}

// push verifies one expanded event and records what it opens, closes and
// owns: the checks of section 3.2, then the rule of the event's type (section
// 3.3).
func (v *verifier) push(e *Event) error {
	tg, err := v.precheck(e)
	if err != nil {
		return err
	}
	switch t := e.typ; t {
	case TextMessageStart, ToolCallStart, ReasoningStart, ReasoningMessageStart:
		return v.open(t, e, tg)
	case TextMessageContent, TextMessageEnd, ToolCallArgs, ToolCallEnd,
		ReasoningMessageContent, ReasoningMessageEnd, ReasoningEnd:
		return v.proceed(t, e, tg)
	case RunStarted:
		v.runStarted = true
		if in := lookup(e.m, "input"); isObject(in) {
			return v.seed(lookup(splitObject(in, nil), "messages"), false)
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
	case ToolCallResult:
		setOwner(&v.msgOwner, e.Str("messageId"), ownerOf(tg))
	case StepStarted:
		return v.startStep(tg, e.Str("stepName"))
	case StepFinished:
		return v.finishStep(tg, e.Str("stepName"))
	case ActivitySnapshot:
		// A snapshot that patches (replace: false) an activity on record keeps its owner.
		aid := e.Str("messageId")
		if _, known := v.activityOwner[aid]; !known || string(lookup(e.m, "replace")) != "false" {
			setOwner(&v.activityOwner, aid, ownerOf(tg))
		}
	case ActivityDelta:
		return tagError(t, tg, "activity", e.Str("messageId"), v.activityOwner)
	case ReasoningEncryptedValue:
		return v.encryptedValue(e, tg)
	case SubagentStarted:
		return v.startSubagent(e)
	case SubagentFinished, SubagentError:
		return v.endSubagent(t, e)
	}
	return nil
}

// precheck runs the checks of section 3.2 in their order and returns the
// event's tag.
func (v *verifier) precheck(e *Event) (tag, error) {
	if err := v.admit(e.typ); err != nil {
		return tag{}, err
	}
	tg := readTag(e.m)
	if tg.state == tagNull {
		return tag{}, optional(e.typ, "subagentRunId")
	}
	return tg, preSubagent(e)
}

// admit runs checks 1 to 4 of section 3.2, the lifecycle of runs: only a new
// run follows RUN_ERROR, only RUN_ERROR or a new run follows RUN_FINISHED, the
// first event starts or errors a run, and a run starts only when none is
// active. A RUN_STARTED after a terminal starts from a clean state.
func (v *verifier) admit(t EventType) error {
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
	return nil
}

// entity is one kind of entity that a START opens and an END closes, with the
// verifier's state for it. The four kinds follow the same rules, worded in
// their own terms; a tool call's START also answers to its parent message
// (section 3.3).
type entity struct {
	label      string // names the kind in the open-set messages
	kind       string // names the kind in the tag error
	key        string // the member that holds the id
	start, end EventType
	// startHint makes the END's "not open" message say how to start one, as
	// the CONTENT's does; the client words only the reasoning message so.
	startHint bool
	set       *orderedSet
	owners    *map[string]owner
}

// entityOf returns the entity that events of type t open, continue or close.
func (v *verifier) entityOf(t EventType) entity {
	switch t {
	case TextMessageStart, TextMessageContent, TextMessageEnd:
		return entity{label: "text message", kind: "message", key: "messageId",
			start: TextMessageStart, end: TextMessageEnd, set: &v.text, owners: &v.msgOwner}
	case ToolCallStart, ToolCallArgs, ToolCallEnd:
		return entity{label: "tool call", kind: "tool call", key: "toolCallId",
			start: ToolCallStart, end: ToolCallEnd, set: &v.tools, owners: &v.toolOwner}
	case ReasoningStart, ReasoningEnd:
		return entity{label: "reasoning span", kind: "reasoning message", key: "messageId",
			start: ReasoningStart, end: ReasoningEnd, set: &v.spans, owners: &v.reasoningOwner}
	}
	return entity{label: "reasoning message", kind: "reasoning message", key: "messageId",
		start: ReasoningMessageStart, end: ReasoningMessageEnd, startHint: true,
		set: &v.reasoning, owners: &v.reasoningOwner}
}

// open checks a START: its id is not open, a tool call agrees with its parent
// message, and a tag agrees with the owner on record, which the first opener
// sets and a reopening keeps.
func (v *verifier) open(t EventType, e *Event, tg tag) error {
	en := v.entityOf(t)
	id := e.Str(en.key)
	if en.set.has(id) {
		return violation("Cannot send '" + string(t) + "' event: A " + en.label + " with ID '" + id + "' is already in progress. Complete it with '" + string(en.end) + "' first.")
	}
	o := ownerOf(tg)
	if t == ToolCallStart {
		var err error
		if o, err = v.toolCallOwner(e, tg, id); err != nil {
			return err
		}
	}
	if err := tagError(t, tg, en.kind, id, *en.owners); err != nil {
		return err
	}
	en.set.add(id)
	setOwnerIfNew(en.owners, id, o)
	return nil
}

// toolCallOwner checks a TOOL_CALL_START against the owner of its parent
// message, since a tool call belongs to the message that carries it: a tag,
// or for an untagged event the call's owner on record, must match it. It
// returns the owner of a new call: the tag, else the parent message's owner,
// else the parent agent.
func (v *verifier) toolCallOwner(e *Event, tg tag, cid string) (owner, error) {
	pv := lookup(e.m, "parentMessageId")
	if !isString(pv) {
		return ownerOf(tg), nil
	}
	pid := unquote(pv)
	pOwner, ok := v.msgOwner[pid]
	switch {
	case !ok:
		return ownerOf(tg), nil
	case tg.state == tagValue && pOwner != ownerOf(tg):
		return owner{}, violation("Cannot send 'TOOL_CALL_START': subagentRunId '" + tg.id + "' does not match its parent message '" + pid + "' owner '" + pOwner.String() + "'. A tool call belongs to the message that carries it.")
	case tg.state == tagValue:
		return pOwner, nil
	}
	if cOwner, ok := v.toolOwner[cid]; ok && cOwner != pOwner {
		return owner{}, violation("Cannot send 'TOOL_CALL_START': tool call '" + cid + "' is owned by '" + cOwner.String() + "' but its parent message '" + pid + "' is owned by '" + pOwner.String() + "'. A tool call belongs to the message that carries it.")
	}
	return pOwner, nil
}

// proceed checks a CONTENT, ARGS or END: its id is open and a tag agrees with
// the owner on record. An END closes the id.
func (v *verifier) proceed(t EventType, e *Event, tg tag) error {
	en := v.entityOf(t)
	raw := lookup(e.m, en.key)
	if t != en.end && isString(raw) && bytes.IndexByte(raw, '\\') < 0 {
		// Deltas are the hot path: an id without escapes is looked up by its
		// encoded bytes, which allocates nothing.
		body := raw[1 : len(raw)-1]
		if _, open := en.set.idx[string(body)]; open && agrees(tg, string(body), *en.owners) {
			return nil
		}
	}
	id := unquote(raw)
	if !en.set.has(id) {
		hint := "Start a " + en.label + " with '" + string(en.start) + "' first."
		if t == en.end && !en.startHint {
			hint = "A '" + string(en.start) + "' event must be sent first."
		}
		return violation("Cannot send '" + string(t) + "' event: No active " + en.label + " found with ID '" + id + "'. " + hint)
	}
	if err := tagError(t, tg, en.kind, id, *en.owners); err != nil {
		return err
	}
	if t == en.end {
		en.set.remove(id)
	}
	return nil
}

// startStep opens a step. Steps are keyed by owner and name, so the parent
// and a subagent may both have a step of one name open, but one owner may not.
func (v *verifier) startStep(tg tag, name string) error {
	so := v.stepsOf(ownerOf(tg), true)
	if so.names.has(name) {
		msg := "Step \"" + name + "\" is already active for 'STEP_STARTED'"
		if tg.state == tagValue {
			msg += " in subagent '" + tg.id + "'"
		}
		return violation(msg)
	}
	so.names.add(name)
	return nil
}

// finishStep closes the owner's step of that name. When the owner has none,
// the message names the first other owner that holds the step, because a step
// is finished by whoever started it.
func (v *verifier) finishStep(tg tag, name string) error {
	o := ownerOf(tg)
	if so := v.stepsOf(o, false); so != nil && so.names.has(name) {
		so.names.remove(name)
		return nil
	}
	for _, other := range v.steps {
		if other.o != o && other.names.has(name) {
			return violation("Cannot send 'STEP_FINISHED' for step \"" + name + "\" attributed to " + describe(o) + ": that step is open under " + describe(other.o) + ". A step must be finished by whoever started it.")
		}
	}
	return violation("Cannot send 'STEP_FINISHED' for step \"" + name + "\" that was not started")
}

// encryptedValue checks the owner of the entity a REASONING_ENCRYPTED_VALUE
// names, which need not be open: a message id is looked up among messages,
// else among reasoning messages.
func (v *verifier) encryptedValue(e *Event, tg tag) error {
	t, eid := e.typ, e.Str("entityId")
	switch e.Str("subtype") {
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
}

// startSubagent checks a SUBAGENT_STARTED: subagent ids are per invocation,
// so an id that is active or has finished in this run is refused, and a
// parent subagent must have started in this run (it may have finished).
func (v *verifier) startSubagent(e *Event) error {
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
	return nil
}

// endSubagent checks a SUBAGENT_FINISHED or SUBAGENT_ERROR: the subagent is
// active. It moves the subagent to the closed set, so a second terminal fails.
func (v *verifier) endSubagent(t EventType, e *Event) error {
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

// preSubagent runs checks 6 to 10 of section 3.2, which guard the subagent
// fields that a loose schema or a bypassed one lets through.
func preSubagent(e *Event) error {
	switch e.typ {
	case SubagentStarted, SubagentFinished, SubagentError:
		return subagentFields(e)
	case RunFinished:
		return interruptTags(e)
	}
	return nil
}

// subagentFields runs checks 6 to 9 on a SUBAGENT_* event: no optional field
// is null, and an outcome has a known type and string interrupt ids.
func subagentFields(e *Event) error {
	t := e.typ
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
	return nil
}

// interruptTags runs check 10: no interrupt of a RUN_FINISHED interrupt
// outcome has a null subagentRunId.
func interruptTags(e *Event) error {
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
