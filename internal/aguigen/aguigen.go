// Package aguigen generates random AG-UI 1.0.0 event sequences for differential tests: each
// sequence is reproducible from (seed, index) alone ([Generate]), and mixes valid producers'
// output with the edge cases and violations a client must judge.
package aguigen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
)

// This file generates the random event sequences of the differential tests. Each
// sequence is reproducible from (seed, index) alone. The generator keeps a rough
// model of what the sequence has opened so that most sequences go deep (chunk
// lanes, owners, subagents, steps, several runs) before they end or fail, and
// it decorates events with the edge cases of AG-UI 1.0.0: tags "" and null,
// repeated and conflicting chunk fields, metadata-only continuations, rawEvent,
// unknown keys, nulls in optional positions, duplicate ids, legacy THINKING_*
// events, and schema-invalid fields.

// Member is one key of a JSON object; Obj keeps insertion order so that the
// generated text reads like a producer's (type first) and so that key order and
// duplicate keys can be varied on purpose.
type Member struct {
	Key string
	Val any
}

// Obj is a JSON object whose members keep their order (and may repeat a key).
type Obj []Member

// absentValue is the value that set ignores: the field is left out.
type absentValue struct{}

var absent = absentValue{}

func (o *Obj) set(key string, v any) *Obj {
	if _, ok := v.(absentValue); ok {
		return o
	}
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Val = v
			return o
		}
	}
	*o = append(*o, Member{key, v})
	return o
}

func (o *Obj) del(key string) {
	for i := range *o {
		if (*o)[i].Key == key {
			*o = append((*o)[:i], (*o)[i+1:]...)
			return
		}
	}
}

func (o Obj) get(key string) (any, bool) {
	for _, m := range o {
		if m.Key == key {
			return m.Val, true
		}
	}
	return nil, false
}

func (o Obj) MarshalJSON() ([]byte, error) { return AppendJSON(nil, o), nil }

// AppendJSON appends the JSON encoding of one of the generator's values (Obj, []any, strings,
// numbers, booleans, nil, json.RawMessage, json.Number), directly: encoding/json would re-scan
// every nested MarshalJSON result, which dominates generation time.
func AppendJSON(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case Obj:
		b = append(b, '{')
		first := true
		for _, m := range x {
			if _, ok := m.Val.(absentValue); ok {
				// A literal Member with an absent value is left out.
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendQuoted(b, m.Key)
			b = append(b, ':')
			b = AppendJSON(b, m.Val)
		}
		return append(b, '}')
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSON(b, e)
		}
		return append(b, ']')
	case string:
		return appendQuoted(b, x)
	case bool:
		return strconv.AppendBool(b, x)
	case int:
		return strconv.AppendInt(b, int64(x), 10)
	case float64:
		return strconv.AppendFloat(b, x, 'g', -1, 64)
	case json.RawMessage:
		return append(b, x...)
	case json.Number:
		return append(b, x...)
	}
	panic(fmt.Sprintf("AppendJSON: unexpected %T", v))
}

func appendQuoted(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func ev(typ string, kv ...any) Obj {
	o := Obj{{"type", typ}}
	for i := 0; i+1 < len(kv); i += 2 {
		o.set(kv[i].(string), kv[i+1])
	}
	return o
}

// lit is a JSON literal written as is (numbers such as 1.0 or 1e3 whose text
// matters to a decoder).
func lit(s string) json.RawMessage { return json.RawMessage(s) }

// openItem is an entity the model believes open, with the tag it was opened with.
type openItem struct {
	id  string
	tag any // absent, a string, or nil (JSON null)
}

type lane struct {
	kind string // "text", "tool", "reasoning"
	id   string
}

// seqGen builds one sequence.
type seqGen struct {
	r       *rand.Rand
	upgrade bool
	// coherence is the probability that a choice follows the model (continue
	// what is open, close it, finish what was started).
	coherence float64
	// badRate is the probability that a choice that has schema-invalid options
	// takes one (zero in "clean" cases).
	badRate float64
	events  []any

	runOpen     bool
	runEverOpen bool
	text        []openItem
	tools       []openItem
	reasonMsgs  []openItem
	spans       []openItem
	steps       []openItem
	subActive   []string
	subDone     []string
	lanes       map[string]lane // tag key ("" parent, "s:x" subagent x) → open chunk stream
	thinking    bool
	thinkingMsg bool
	nextID      int
}

// Case is one generated sequence.
type Case struct {
	ID     string            // "gen-<seed>-<index>"
	Events []json.RawMessage // the events as a producer wrote them (not always valid)
	// Upgrade says the case is meant for a client applying the legacy upgrade
	// (CompatibilityBoundary) first.
	Upgrade bool
}

// Generate returns the sequence number index of the given seed.
func Generate(seed uint64, index int) Case {
	r := rand.New(rand.NewPCG(seed, uint64(index)))
	g := &seqGen{r: r, lanes: map[string]lane{}}
	g.upgrade = r.Float64() < 0.25
	if r.Float64() < 0.5 {
		g.coherence = 0.96 + 0.04*r.Float64()
	} else {
		g.coherence = 0.5 + 0.46*r.Float64()
	}
	if r.Float64() < 0.35 {
		g.badRate = 0.02 + 0.2*r.Float64()
	}
	g.build()
	c := Case{ID: "gen-" + strconv.FormatUint(seed, 10) + "-" + strconv.Itoa(index), Upgrade: g.upgrade}
	lone := r.Float64() < 0.02
	for _, e := range g.events {
		b := AppendJSON(nil, e)
		if lone {
			for _, s := range surrogates {
				b = bytes.ReplaceAll(b, []byte(s[0]), []byte(s[1]))
			}
		}
		c.Events = append(c.Events, g.spelling(b))
	}
	return c
}

// escapes are spellings of the same JSON text that a decoder working on raw
// bytes must see through: escaped keys and values, an escaped solidus.
var escapes = [][2]string{
	{`"type":`, `"\u0074ype":`},
	{`"messageId":"m1"`, `"messageId":"m\u0031"`},
	{`"toolCallId":"c1"`, `"toolCallId":"c\u0031"`},
	{`"subagentRunId":"s1"`, `"subagentRunId":"\u00731"`},
	{`"subagentRunId":`, `"subagent\u0052unId":`},
	{`"delta":"a"`, `"delta":"\u0061"`},
	{`"role":"assistant"`, `"role":"assist\u0061nt"`},
	{`"type":"TEXT_MESSAGE_CHUNK"`, `"type":"TEXT_MESSAGE_\u0043HUNK"`},
	{`"stepName":"a"`, `"stepName":"\u0061"`},
	{`"path":"/a"`, `"path":"\/a"`},
	{`"messageId":"x"`, `"messageId":"\ud83d\ude00"`},
}

// surrogates renames ids, consistently through a sequence, to lone UTF-16
// surrogates: JSON.parse keeps each as a distinct code unit, so they are
// different ids (a decoder that maps them all to U+FFFD merges them).
var surrogates = [][2]string{
	{`"m2"`, `"\ud800"`},
	{`"m3"`, `"\udc00"`},
	{`"b"`, `"\udfff"`},
	{`"c2"`, `"\ud801"`},
}

// spelling rewrites an event's text, rarely, into another spelling of the
// same value (escapes, insignificant whitespace). The reference reads the
// value; the pipeline reads these bytes.
func (g *seqGen) spelling(b []byte) []byte {
	if g.p(0.03) {
		for _, e := range escapes {
			if g.p(0.5) {
				b = bytes.Replace(b, []byte(e[0]), []byte(e[1]), 1)
			}
		}
	}
	if g.p(0.02) {
		var buf bytes.Buffer
		if json.Indent(&buf, b, " ", pick(g, "  ", "\t", "")) == nil {
			b = append([]byte(pick(g, "", " ", "\r\n")), buf.Bytes()...)
		}
	}
	return b
}

func (g *seqGen) p(x float64) bool { return g.r.Float64() < x }

// bad reports whether to take a schema-invalid option.
func (g *seqGen) bad() bool { return g.p(g.badRate) }

// incoherent returns a choice in [0, n): choices 0 and 1 (continuations of
// nothing) only when the case is being incoherent, else one of 2..n-1.
func (g *seqGen) incoherent(n int) int {
	if g.p(g.coherence) {
		return 2 + g.r.IntN(n-2)
	}
	return g.r.IntN(n)
}

// legacyNull reports whether to put one of the nulls the legacy upgrade
// removes (schema-invalid without it).
func (g *seqGen) legacyNull() bool {
	if g.upgrade {
		return g.p(0.15)
	}
	return g.bad()
}

// choose picks one of valid, or one of invalid when bad says so.
func (g *seqGen) choose(valid []any, invalid ...any) any {
	if len(invalid) > 0 && g.bad() {
		return invalid[g.r.IntN(len(invalid))]
	}
	return valid[g.r.IntN(len(valid))]
}

func vals(v ...any) []any { return v }

func pick[T any](g *seqGen, xs ...T) T { return xs[g.r.IntN(len(xs))] }

// emit appends an event and closes the chunk lanes it closes
// (transformChunks, AGUI.md section 2.2), so that the model's chunk
// continuations mostly continue something.
func (g *seqGen) emit(o any) {
	g.events = append(g.events, o)
	e, ok := o.(Obj)
	if !ok {
		return
	}
	typ, _ := e.get("type")
	t, tagged := e.get("subagentRunId")
	if !tagged {
		t = absent
	}
	switch typ {
	case "TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK",
		"RAW", "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA", "REASONING_ENCRYPTED_VALUE", "SUBAGENT_STARTED":
	case "RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT":
		g.lanes = map[string]lane{}
	case "SUBAGENT_FINISHED", "SUBAGENT_ERROR":
		if s, ok := t.(string); ok {
			delete(g.lanes, laneKey(s))
		}
	case "FOO", "text_message_start":
		// Unknown types pass through.
	default:
		delete(g.lanes, laneKey(t))
	}
}

// tag returns a subagentRunId value: mostly absent, often a subagent, sometimes
// the empty-string lane, rarely null.
func (g *seqGen) tag() any {
	x := g.r.Float64()
	switch {
	case x < 0.5:
		return absent
	case x < 0.7:
		return "s1"
	case x < 0.82:
		return "s2"
	case x < 0.9:
		return ""
	case x < 0.95:
		return "s3"
	case x < 0.995 || !g.bad():
		// A tag from an active subagent when there is one.
		if len(g.subActive) > 0 {
			return pick(g, g.subActive...)
		}
		return "s1"
	default:
		return nil
	}
}

// sameTag is the tag of an open item, mostly as opened, sometimes dropped or changed.
func (g *seqGen) sameTag(t any) any {
	if g.p(g.coherence) {
		if g.p(0.25) {
			return absent
		}
		return t
	}
	return g.tag()
}

func laneKey(t any) string {
	if s, ok := t.(string); ok {
		return "s:" + s
	}
	return ""
}

// fresh returns an id nothing has used, for coherent openers.
func (g *seqGen) fresh(prefix string) string {
	g.nextID++
	return prefix + strconv.Itoa(10+g.nextID)
}

// msgID, toolID and reasonID return ids from small pools shared between kinds
// (so that ids collide across lanes, runs and kinds), or fresh ones.
func (g *seqGen) msgID() string {
	if g.p(0.5 * g.coherence) {
		return g.fresh("m")
	}
	if g.p(0.02) {
		return g.oddID()
	}
	return pick(g, "m1", "m1", "m2", "m2", "m3", "", "x", "r1")
}

// oddID is an id that needs escaping or is not ASCII: synthesized events and
// error messages must carry it exactly.
func (g *seqGen) oddID() string {
	return pick(g, `m"1`, `m\1`, "m\n", "m\t", "mé", "m\u2028", "😀", "m\u0000", "m/1", "m\u007f", "<m>&")
}

func (g *seqGen) toolID() string {
	if g.p(0.5 * g.coherence) {
		return g.fresh("c")
	}
	if g.p(0.02) {
		return g.oddID()
	}
	return pick(g, "c1", "c1", "c2", "c2", "c3", "", "m1")
}

func (g *seqGen) reasonID() string {
	if g.p(0.5 * g.coherence) {
		return g.fresh("r")
	}
	return pick(g, "r1", "r1", "r2", "r2", "m1", "")
}
func (g *seqGen) actID() string { return pick(g, "a1", "a1", "a2", "m1") }

func (g *seqGen) build() {
	n := 1 + g.r.IntN(8)
	if g.p(0.7) {
		n += g.r.IntN(24)
	}
	// The first event: nearly always RUN_STARTED.
	switch x := g.r.Float64(); {
	case x < 0.96:
		g.runStarted()
	case x < 0.98:
		g.emit(g.decorate(ev("RUN_ERROR", "message", "boom")))
	default:
		g.step()
	}
	for i := 0; i < n; i++ {
		g.step()
	}
	if g.p(0.8 * g.coherence) {
		g.closeAll()
	}
	if g.p(0.75) {
		g.runFinished()
	} else if g.p(0.3) {
		g.emit(g.decorate(ev("RUN_ERROR", "message", "boom")))
	}
	if g.p(0.05) {
		g.duplicateKey()
	}
	if g.p(0.1) {
		g.schemaBreak()
	}
	if !g.upgrade && g.p(0.01) {
		// Not in upgrade cases: the client's upgrade dereferences every event
		// (a TypeError on null); its transports refuse non-objects before that.
		g.nonObject()
	}
}

// closeAll closes what the model believes open, as a tidy producer would
// before RUN_FINISHED.
func (g *seqGen) closeAll() {
	for len(g.text) > 0 && g.p(0.95) {
		it := g.text[0]
		g.text = g.text[1:]
		g.emit(g.decorate(ev("TEXT_MESSAGE_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
	}
	for len(g.tools) > 0 && g.p(0.95) {
		it := g.tools[0]
		g.tools = g.tools[1:]
		g.emit(g.decorate(ev("TOOL_CALL_END", "toolCallId", it.id, "subagentRunId", g.sameTag(it.tag))))
	}
	for len(g.reasonMsgs) > 0 && g.p(0.95) {
		it := g.reasonMsgs[0]
		g.reasonMsgs = g.reasonMsgs[1:]
		g.emit(g.decorate(ev("REASONING_MESSAGE_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
	}
	for len(g.spans) > 0 && g.p(0.95) {
		it := g.spans[0]
		g.spans = g.spans[1:]
		g.emit(g.decorate(ev("REASONING_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
	}
	for len(g.steps) > 0 && g.p(0.95) {
		it := g.steps[len(g.steps)-1]
		g.steps = g.steps[:len(g.steps)-1]
		g.emit(g.decorate(ev("STEP_FINISHED", "stepName", it.id, "subagentRunId", g.sameTag(it.tag))))
	}
	for len(g.subActive) > 0 && g.p(0.95) {
		s := g.subActive[len(g.subActive)-1]
		g.subActive = g.subActive[:len(g.subActive)-1]
		g.subDone = append(g.subDone, s)
		g.emit(g.decorate(ev("SUBAGENT_FINISHED", "subagentRunId", s)))
	}
}

func (g *seqGen) resetRun() {
	g.text, g.tools, g.reasonMsgs, g.spans, g.steps = nil, nil, nil, nil, nil
	g.subActive, g.subDone = nil, nil
	g.lanes = map[string]lane{}
}

func (g *seqGen) runStarted() {
	e := ev("RUN_STARTED", "threadId", "t1", "runId", pick(g, "r1", "r1", "r2", ""))
	if g.p(0.05) {
		e.set("subagentRunId", g.undeclaredTag())
	}
	if g.p(0.1) {
		e.set("protocolVersion", g.choose(vals("1.0", "0.0.1"), 1))
	}
	if g.p(0.05) {
		e.set("parentRunId", g.choose(vals("r0"), nil))
	}
	if g.p(0.2) {
		e.set("input", g.runInput())
	}
	g.emit(g.decorate(e))
	g.resetRun()
	g.runOpen, g.runEverOpen = true, true
}

func (g *seqGen) runInput() Obj {
	in := Obj{{"threadId", "t1"}, {"runId", "r1"}}
	msgs := []any{}
	for i := g.r.IntN(4); i > 0; i-- {
		msgs = append(msgs, g.message())
	}
	if g.bad() {
		msgs = append(msgs, pick[any](g, 5, nil, "m", []any{}))
	}
	in.set("messages", msgs)
	if g.p(0.2) {
		in.set("state", pick[any](g, nil, Obj{{"k", 1}}, "s"))
	}
	if g.p(0.2) {
		params := g.choose(vals(Obj{}, absent), nil)
		if g.legacyNull() {
			params = nil
		}
		in.set("tools", []any{Obj{{"name", "f"}, {"description", "d"}, {"parameters", params}}})
	}
	if g.p(0.15) {
		in.set("context", []any{Obj{{"description", "d"}, {"value", g.choose(vals("v"), 1)}}})
	}
	if g.p(0.15) {
		fp := g.choose(vals(Obj{{"demo", true}}, Obj{}), 1, nil)
		if g.legacyNull() {
			fp = nil
		}
		in.set("forwardedProps", fp)
	}
	if g.p(0.1) {
		payload := g.choose(vals(Obj{}, absent, "p"), nil)
		if g.legacyNull() {
			payload = nil
		}
		in.set("resume", []any{Obj{{"interruptId", "i1"}, {"status", g.choose(vals("resolved", "cancelled"), "pending")}, {"payload", payload}}})
	}
	if g.p(0.1) {
		in.set("extra", 1)
	}
	if g.bad() {
		in.del(pick(g, "threadId", "runId", "messages"))
	}
	return in
}

// message returns a message for MESSAGES_SNAPSHOT or RUN_STARTED.input.
func (g *seqGen) message() Obj {
	role := g.choose(vals("assistant", "assistant", "user", "user", "tool", "system", "developer", "activity", "reasoning"), "robot").(string)
	m := Obj{{"id", pick(g, "m1", "m2", "m3", "x", "r1", "a1", "c1")}, {"role", role}}
	switch role {
	case "assistant":
		if g.p(0.6) {
			m.set("content", "hi")
		}
		if g.p(0.5) {
			calls := []any{}
			for i := 1 + g.r.IntN(2); i > 0; i-- {
				tc := Obj{{"id", g.toolID()}, {"type", "function"}, {"function", Obj{{"name", "f"}, {"arguments", "{}"}}}}
				if g.p(0.1) {
					tc.set("subagentRunId", g.tag())
				}
				calls = append(calls, tc)
			}
			m.set("toolCalls", calls)
		}
	case "user":
		if g.p(0.5) {
			m.set("content", "hello")
		} else {
			m.set("content", g.parts())
		}
	case "tool":
		m.set("content", pick[any](g, "ok", g.parts()))
		m.set("toolCallId", g.toolID())
		if g.p(0.1) {
			m.set("error", "e")
		}
	case "system", "developer", "reasoning":
		m.set("content", "c")
	case "activity":
		m.set("activityType", "a")
		m.set("content", g.choose(vals(Obj{}, Obj{{"n", 1}}), []any{}))
	}
	if g.p(0.35) {
		m.set("subagentRunId", g.tag())
	}
	if g.p(0.1) {
		m.set("metadata", g.choose(vals(Obj{{"k", nil}}), nil))
	}
	if g.p(0.1) {
		m.set("junk", 1)
	}
	return m
}

func (g *seqGen) parts() []any {
	var ps []any
	for i := 1 + g.r.IntN(2); i > 0; i-- {
		kind := g.r.IntN(4)
		if g.upgrade || g.bad() {
			kind = g.r.IntN(6)
		}
		switch kind {
		case 0:
			ps = append(ps, Obj{{"type", "text"}, {"text", "t"}})
		case 1:
			ps = append(ps, Obj{{"type", "image"}, {"source", Obj{{"type", "data"}, {"value", "aGk="}, {"mimeType", "image/png"}}}})
		case 2:
			ps = append(ps, Obj{{"type", "document"}, {"source", Obj{{"type", "url"}, {"value", "http://x"}}}, {"metadata", g.choose(vals("m", Obj{}, absent), nil)}})
		case 3:
			ps = append(ps, Obj{{"type", "audio"}, {"source", Obj{{"type", g.choose(vals("file"), "blob")}, {"value", "f1"}}}})
		case 4:
			ps = append(ps, Obj{{"type", "binary"}, {"mimeType", pick(g, "image/png", "application/pdf", "audio/wav")}, {"data", "aGk="}})
		default:
			switch g.r.IntN(4) {
			case 0:
				ps = append(ps, Obj{{"type", "binary"}, {"mimeType", "video/mp4"}, {"url", "http://v"}, {"filename", "v.mp4"}})
			case 1:
				// The same media twice, legacy and modern (the upgrade keeps one).
				ps = append(ps, Obj{{"type", "binary"}, {"mimeType", "video/mp4"}, {"url", "http://v"}, {"filename", "v.mp4"}},
					Obj{{"type", "video"}, {"source", Obj{{"type", "url"}, {"value", "http://v"}, {"mimeType", "video/mp4"}}}, {"metadata", pick[any](g, Obj{{"filename", "v.mp4"}}, Obj{{"filename", "w.mp4"}}, absent)}})
			case 2:
				// Only an id: the upgrade leaves it, the schema refuses it.
				ps = append(ps, Obj{{"type", "binary"}, {"mimeType", "image/png"}, {"id", "f1"}})
			default:
				// Odd members: the client converts by truthiness (an empty data
				// or filename counts as absent) and keeps only what it knows.
				ps = append(ps, Obj{{"type", "binary"}, {"mimeType", pick[any](g, "text/plain", "", 5, "IMAGE/PNG")}, {"id", "f2"},
					{"data", pick[any](g, "eA==", "", absent, 0, 1, true, false, []any{}, Obj{}, nil)}, {"url", pick[any](g, "http://u", "", absent, 0, nil)},
					{"filename", pick[any](g, "", "f.txt", absent, 5, lit("5.0"), nil)}, {"extra", pick[any](g, 1, absent)}})
			}
		}
	}
	if g.bad() {
		ps = append(ps, pick[any](g, 5, nil, "t", []any{}))
	}
	return ps
}

// step emits one or a few events.
func (g *seqGen) step() {
	if !g.runOpen && g.p(g.coherence) && g.runEverOpen {
		g.runStarted()
		return
	}
	x := g.r.IntN(100)
	for g.runOpen && x >= 92 && g.p(g.coherence) {
		// A coherent producer does not end or restart a run mid-way.
		x = g.r.IntN(100)
	}
	switch {
	case x < 18:
		g.textChunk()
	case x < 30:
		g.textExplicit()
	case x < 38:
		g.toolChunk()
	case x < 46:
		g.toolExplicit()
	case x < 51:
		g.reasoningChunk()
	case x < 57:
		g.reasoningExplicit()
	case x < 63:
		g.subagent()
	case x < 68:
		g.stepEvent()
	case x < 72:
		g.activity()
	case x < 76:
		g.stateEvent()
	case x < 79:
		g.emit(g.decorate(ev("CUSTOM", "name", "c", "value", pick[any](g, 1, nil, Obj{}), "subagentRunId", g.tagRare())))
	case x < 82:
		g.emit(g.decorate(ev("RAW", "event", pick[any](g, Obj{}, nil, "e"), "source", pick[any](g, absent, "src"), "subagentRunId", g.tagRare())))
	case x < 85:
		g.messagesSnapshot()
	case x < 87:
		g.toolResult()
	case x < 89:
		g.encryptedValue()
	case x < 91:
		if g.upgrade || g.bad() {
			g.legacy()
		} else {
			g.textChunk()
		}
	case x < 92:
		if g.bad() {
			g.emit(g.decorate(ev(pick(g, "FOO", "THINKING_START", "text_message_start"))))
		} else {
			g.emit(g.decorate(ev("CUSTOM", "name", "c", "value", nil)))
		}
	case x < 95:
		g.runFinished()
	case x < 97:
		g.emit(g.decorate(ev("RUN_ERROR", "message", "boom", "code", g.choose(vals(absent, "c"), nil), "subagentRunId", g.rare(g.undeclaredTag))))
		g.runOpen = false
		g.lanes = map[string]lane{}
	default:
		g.runStarted()
	}
}

// undeclaredTag is a subagentRunId for the events that do not declare one
// (RUN_*, MESSAGES_SNAPSHOT): the schema lets any value through, and the
// verifier refuses only null.
func (g *seqGen) undeclaredTag() any {
	if g.p(0.6) {
		return g.tag()
	}
	return pick[any](g, nil, 5, Obj{{"x", 1}}, true)
}

// rare returns f() sometimes, else absent.
func (g *seqGen) rare(f func() any) any {
	if g.p(0.05) {
		return f()
	}
	return absent
}

func (g *seqGen) tagRare() any {
	if g.p(0.7) {
		return absent
	}
	return g.tag()
}

// chunkLaneTag picks the tag of an open chunk lane of the kind, or any tag.
func (g *seqGen) chunkLane(kind string) (any, lane, bool) {
	var keys []string
	for k, l := range g.lanes {
		if l.kind == kind {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return absent, lane{}, false
	}
	// Map iteration order is random; sort for reproducibility.
	slices.Sort(keys)
	k := pick(g, keys...)
	var t any = absent
	if k != "" {
		t = k[2:]
	}
	return t, g.lanes[k], true
}

func (g *seqGen) textChunk() {
	e := ev("TEXT_MESSAGE_CHUNK")
	t, l, open := g.chunkLane("text")
	var id any = absent
	var tag any
	if open && g.p(g.coherence) {
		// Continue an open stream: by id, by tag, or by neither.
		switch g.r.IntN(4) {
		case 0:
			id, tag = l.id, t
		case 1:
			tag = t
		case 2:
			id, tag = l.id, absent
		default:
			tag = absent
		}
		if g.p(0.15) {
			e.set("role", pick(g, "assistant", "user", "system"))
		}
		if g.p(0.1) {
			e.set("name", pick(g, "bob", "eve"))
		}
	} else {
		if g.p(g.coherence) || g.p(0.7) {
			id = g.msgID()
		}
		tag = g.tag()
		if g.p(0.3) {
			e.set("role", g.choose(vals("assistant", "user", "developer", "system"), "wizard", "tool"))
		}
		if g.p(0.15) {
			e.set("name", "bob")
		}
	}
	e.set("messageId", id)
	if g.p(0.8) {
		e.set("delta", pick(g, "a", "b", "", "hello"))
	}
	e.set("subagentRunId", tag)
	g.emit(g.decorate(e))
	g.noteChunk("text", id, tag)
}

func (g *seqGen) noteChunk(kind string, id, tag any) {
	k := laneKey(tag)
	if s, ok := id.(string); ok {
		g.lanes[k] = lane{kind, s}
	}
}

func (g *seqGen) textExplicit() {
	if len(g.text) > 0 && g.p(g.coherence) {
		i := g.r.IntN(len(g.text))
		it := g.text[i]
		if g.p(0.6) {
			g.emit(g.decorate(ev("TEXT_MESSAGE_CONTENT", "messageId", it.id, "delta", pick(g, "x", "", "yz"), "subagentRunId", g.sameTag(it.tag))))
		} else {
			g.emit(g.decorate(ev("TEXT_MESSAGE_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
			g.text = append(g.text[:i], g.text[i+1:]...)
		}
		return
	}
	switch g.incoherent(5) {
	case 0:
		g.emit(g.decorate(ev("TEXT_MESSAGE_CONTENT", "messageId", g.msgID(), "delta", "x", "subagentRunId", g.tag())))
	case 1:
		g.emit(g.decorate(ev("TEXT_MESSAGE_END", "messageId", g.msgID(), "subagentRunId", g.tag())))
	default:
		id, t := g.msgID(), g.tag()
		e := ev("TEXT_MESSAGE_START", "messageId", id, "subagentRunId", t)
		if g.p(0.4) {
			e.set("role", g.choose(vals("assistant", "user", "system", "developer"), "tool"))
		}
		if g.p(0.1) {
			e.set("name", "bob")
		}
		g.emit(g.decorate(e))
		g.text = append(g.text, openItem{id, t})
	}
}

func (g *seqGen) toolChunk() {
	e := ev("TOOL_CALL_CHUNK")
	t, l, open := g.chunkLane("tool")
	var id any = absent
	var tag any
	if open && g.p(g.coherence) {
		switch g.r.IntN(4) {
		case 0:
			id, tag = l.id, t
		case 1:
			tag = t
		case 2:
			id, tag = l.id, absent
		default:
			tag = absent
		}
		if g.p(0.15) {
			e.set("toolCallName", pick(g, "f", "g"))
		}
		if g.p(0.1) {
			e.set("parentMessageId", pick[any](g, "p1", "p2"))
		}
	} else {
		if g.p(g.coherence) || g.p(0.7) {
			id = g.toolID()
		}
		tag = g.tag()
		if g.p(g.coherence) || g.p(0.7) {
			e.set("toolCallName", pick(g, "f", "f", "g", ""))
		}
		if g.p(0.3) {
			e.set("parentMessageId", pick[any](g, "m1", "p1", "m2"))
		}
	}
	e.set("toolCallId", id)
	if g.p(0.75) {
		e.set("delta", pick(g, "{", "}", "", "{}"))
	}
	e.set("subagentRunId", tag)
	g.emit(g.decorate(e))
	g.noteChunk("tool", id, tag)
}

func (g *seqGen) toolExplicit() {
	if len(g.tools) > 0 && g.p(g.coherence) {
		i := g.r.IntN(len(g.tools))
		it := g.tools[i]
		if g.p(0.6) {
			g.emit(g.decorate(ev("TOOL_CALL_ARGS", "toolCallId", it.id, "delta", pick(g, "{", "}", ""), "subagentRunId", g.sameTag(it.tag))))
		} else {
			g.emit(g.decorate(ev("TOOL_CALL_END", "toolCallId", it.id, "subagentRunId", g.sameTag(it.tag))))
			g.tools = append(g.tools[:i], g.tools[i+1:]...)
		}
		return
	}
	switch g.incoherent(5) {
	case 0:
		g.emit(g.decorate(ev("TOOL_CALL_ARGS", "toolCallId", g.toolID(), "delta", "{}", "subagentRunId", g.tag())))
	case 1:
		g.emit(g.decorate(ev("TOOL_CALL_END", "toolCallId", g.toolID(), "subagentRunId", g.tag())))
	default:
		id, t := g.toolID(), g.tag()
		e := ev("TOOL_CALL_START", "toolCallId", id, "toolCallName", pick(g, "f", "g"), "subagentRunId", t)
		if g.p(0.5) {
			var pid any = g.msgID()
			if len(g.text) > 0 && g.p(0.5) {
				pid = pick(g, g.text...).id
			}
			if g.legacyNull() {
				pid = nil
			}
			e.set("parentMessageId", pid)
		}
		g.emit(g.decorate(e))
		g.tools = append(g.tools, openItem{id, t})
	}
}

func (g *seqGen) reasoningChunk() {
	e := ev("REASONING_MESSAGE_CHUNK")
	t, l, open := g.chunkLane("reasoning")
	var id any = absent
	var tag any
	if open && g.p(g.coherence) {
		switch g.r.IntN(4) {
		case 0:
			id, tag = l.id, t
		case 1:
			tag = t
		case 2:
			id, tag = l.id, absent
		default:
			tag = absent
		}
	} else {
		if g.p(g.coherence) || g.p(0.7) {
			id = g.reasonID()
		}
		tag = g.tag()
	}
	e.set("messageId", id)
	if g.p(0.75) {
		e.set("delta", pick(g, "think", "", "more"))
	}
	if g.p(0.1) {
		e.set("role", pick[any](g, "reasoning", "x", nil))
	}
	e.set("subagentRunId", tag)
	g.emit(g.decorate(e))
	g.noteChunk("reasoning", id, tag)
}

func (g *seqGen) reasoningExplicit() {
	if len(g.spans)+len(g.reasonMsgs) > 0 && g.p(g.coherence) {
		if len(g.reasonMsgs) > 0 && (len(g.spans) == 0 || g.p(0.6)) {
			i := g.r.IntN(len(g.reasonMsgs))
			it := g.reasonMsgs[i]
			if g.p(0.6) {
				g.emit(g.decorate(ev("REASONING_MESSAGE_CONTENT", "messageId", it.id, "delta", pick(g, "x", ""), "subagentRunId", g.sameTag(it.tag))))
			} else {
				g.emit(g.decorate(ev("REASONING_MESSAGE_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
				g.reasonMsgs = append(g.reasonMsgs[:i], g.reasonMsgs[i+1:]...)
			}
			return
		}
		i := g.r.IntN(len(g.spans))
		it := g.spans[i]
		if g.p(0.5) {
			// A message inside the span, often with the span's id.
			id := it.id
			if g.p(0.4) {
				id = g.reasonID()
			}
			g.emit(g.decorate(ev("REASONING_MESSAGE_START", "messageId", id, "role", "reasoning", "subagentRunId", g.sameTag(it.tag))))
			g.reasonMsgs = append(g.reasonMsgs, openItem{id, it.tag})
			return
		}
		g.emit(g.decorate(ev("REASONING_END", "messageId", it.id, "subagentRunId", g.sameTag(it.tag))))
		g.spans = append(g.spans[:i], g.spans[i+1:]...)
		return
	}
	id, t := g.reasonID(), g.tag()
	switch g.incoherent(6) {
	case 0:
		g.emit(g.decorate(ev("REASONING_MESSAGE_CONTENT", "messageId", id, "delta", "x", "subagentRunId", t)))
	case 1:
		g.emit(g.decorate(ev(pick(g, "REASONING_END", "REASONING_MESSAGE_END"), "messageId", id, "subagentRunId", t)))
	case 2, 3:
		g.emit(g.decorate(ev("REASONING_START", "messageId", id, "subagentRunId", t)))
		g.spans = append(g.spans, openItem{id, t})
	default:
		role := any("reasoning")
		if g.bad() {
			role = pick[any](g, absent, "assistant")
		}
		g.emit(g.decorate(ev("REASONING_MESSAGE_START", "messageId", id, "role", role, "subagentRunId", t)))
		g.reasonMsgs = append(g.reasonMsgs, openItem{id, t})
	}
}

func (g *seqGen) subagent() {
	if len(g.subActive) > 0 && g.p(0.5*g.coherence+0.2) {
		i := g.r.IntN(len(g.subActive))
		s := g.subActive[i]
		g.subActive = append(g.subActive[:i], g.subActive[i+1:]...)
		g.subDone = append(g.subDone, s)
		if g.p(0.75) {
			e := ev("SUBAGENT_FINISHED", "subagentRunId", s)
			if g.p(0.2) {
				e.set("outcome", g.choose(vals(
					Obj{{"type", "success"}},
					Obj{{"type", "suspended"}},
					Obj{{"type", "suspended"}, {"interruptIds", []any{"i1"}}},
					Obj{{"type", "success"}, {"extra", 1}}),
					Obj{{"type", "suspended"}, {"interruptIds", nil}},
					Obj{{"type", "suspended"}, {"interruptIds", []any{1}}},
					Obj{{"type", "interrupt"}},
					nil))
			}
			if g.p(0.1) {
				e.set("result", g.choose(vals("r", Obj{}, 0), nil))
			}
			g.emit(g.decorate(e))
		} else {
			g.emit(g.decorate(ev("SUBAGENT_ERROR", "subagentRunId", s, "message", "x", "code", g.choose(vals(absent, absent, "c"), nil), "outcome", g.rare(g.undeclaredOutcome))))
		}
		return
	}
	if !g.p(g.coherence) {
		// Terminal for a subagent that is not active.
		id := pick[any](g, "s1", "s2", "nope", "")
		if len(g.subDone) > 0 && g.p(0.5) {
			id = pick(g, g.subDone...)
		}
		typ := pick(g, "SUBAGENT_FINISHED", "SUBAGENT_ERROR", "SUBAGENT_STARTED")
		e := ev(typ, "subagentRunId", id)
		if typ == "SUBAGENT_ERROR" {
			e.set("message", "x")
		}
		if typ == "SUBAGENT_STARTED" {
			e.set("name", "n")
		}
		g.emit(g.decorate(e))
		return
	}
	id := pick(g, "s1", "s1", "s2", "s3", "")
	e := ev("SUBAGENT_STARTED", "subagentRunId", id, "name", "n")
	if g.p(0.15) {
		e.set("description", g.choose(vals("d", ""), nil))
	}
	if g.p(0.25) {
		var p any = pick(g, "s1", "s9")
		if len(g.subActive)+len(g.subDone) == 0 && g.p(g.coherence) {
			p = absent
		} else if len(g.subActive) > 0 && g.p(0.5) {
			p = pick(g, g.subActive...)
		} else if len(g.subDone) > 0 && g.p(0.5) {
			p = pick(g, g.subDone...)
		}
		if g.bad() {
			p = nil
		}
		e.set("parentSubagentRunId", p)
	}
	if g.p(0.1) {
		e.set("parentToolCallId", g.choose(vals("c1"), nil))
	}
	if g.p(0.1) {
		e.set("parentMessageId", g.choose(vals("m1"), nil))
	}
	if g.p(0.06) {
		e.set("outcome", g.undeclaredOutcome())
	}
	g.emit(g.decorate(e))
	g.subActive = append(g.subActive, id)
}

// undeclaredOutcome is an "outcome" for SUBAGENT_STARTED or SUBAGENT_ERROR,
// which do not declare one: the schema lets any value through and the
// verifier judges it, quoting String(outcome.type) in its message.
func (g *seqGen) undeclaredOutcome() any {
	typ := pick[any](g, "weird", "success", "suspended", "", 5, lit("1e21"), lit("0.1"), lit("-0"), lit("1.5e-7"), lit("100"),
		[]any{1, nil, 2}, []any{}, Obj{}, true, nil, absent)
	if g.p(0.15) {
		return pick[any](g, "success", 5, []any{}, false, 0, "")
	}
	o := Obj{{"type", typ}}
	if g.p(0.3) {
		o.set("interruptIds", pick[any](g, nil, []any{1}, []any{"i1"}, []any{"i1", nil}, "i1", Obj{}))
	}
	return o
}

func (g *seqGen) stepEvent() {
	if len(g.steps) > 0 && g.p(g.coherence) {
		i := g.r.IntN(len(g.steps))
		it := g.steps[i]
		g.emit(g.decorate(ev("STEP_FINISHED", "stepName", it.id, "subagentRunId", g.sameTag(it.tag))))
		g.steps = append(g.steps[:i], g.steps[i+1:]...)
		return
	}
	name, t := pick(g, "a", "a", "tools", "b", ""), g.tag()
	if len(g.steps) > 0 && g.p(0.1) {
		// Start an open step again, under the same owner or another.
		it := pick(g, g.steps...)
		name, t = it.id, g.sameTag(it.tag)
	}
	if !g.p(g.coherence) {
		g.emit(g.decorate(ev("STEP_FINISHED", "stepName", name, "subagentRunId", t)))
		return
	}
	g.emit(g.decorate(ev("STEP_STARTED", "stepName", name, "subagentRunId", t)))
	g.steps = append(g.steps, openItem{name, t})
}

func (g *seqGen) patch() []any {
	var ops []any
	for i := g.r.IntN(3); i > 0; i-- {
		kind := g.r.IntN(7)
		if kind > 3 && g.bad() {
			kind = 4 + g.r.IntN(3)
		} else {
			kind = g.r.IntN(4)
		}
		switch kind {
		case 0:
			ops = append(ops, Obj{{"op", pick(g, "add", "replace", "test")}, {"path", g.choose(vals("/a", "", "/a~1b", "/a/0", "/~0"), "a", "/~2", "/a~")}, {"value", pick[any](g, 1, nil, Obj{})}})
		case 1:
			ops = append(ops, Obj{{"op", "remove"}, {"path", "/a"}, {"value", 1}})
		case 2:
			ops = append(ops, Obj{{"op", pick(g, "move", "copy")}, {"from", "/a"}, {"path", "/b"}, {"extra", true}})
		case 3:
			ops = append(ops, Obj{{"op", "test"}, {"path", "/a"}, {"value", "x"}})
		case 4:
			ops = append(ops, Obj{{"op", "copy"}, {"path", "/b"}})
		case 5:
			ops = append(ops, Obj{{"op", "replace"}, {"path", "/a"}})
		default:
			ops = append(ops, Obj{{"op", pick(g, "merge", "ADD")}, {"path", "/a"}, {"value", 1}})
		}
	}
	if ops == nil {
		ops = []any{}
	}
	return ops
}

func (g *seqGen) activity() {
	id := g.actID()
	if g.p(0.6) {
		e := ev("ACTIVITY_SNAPSHOT", "messageId", id, "activityType", "a", "content", g.choose(vals(Obj{}, Obj{}, Obj{{"n", 1}}), []any{}, nil), "subagentRunId", g.tag())
		if g.p(0.3) {
			e.set("replace", g.choose(vals(true, false), nil, "no"))
		}
		g.emit(g.decorate(e))
		return
	}
	g.emit(g.decorate(ev("ACTIVITY_DELTA", "messageId", id, "activityType", "a", "patch", g.patch(), "subagentRunId", g.tag())))
}

func (g *seqGen) stateEvent() {
	if g.p(0.5) {
		g.emit(g.decorate(ev("STATE_SNAPSHOT", "snapshot", pick[any](g, Obj{}, nil, []any{1}, "s"), "subagentRunId", g.tagRare())))
		return
	}
	g.emit(g.decorate(ev("STATE_DELTA", "delta", g.patch(), "subagentRunId", g.tagRare())))
}

func (g *seqGen) messagesSnapshot() {
	msgs := []any{}
	for i := g.r.IntN(4); i > 0; i-- {
		msgs = append(msgs, g.message())
	}
	if g.bad() {
		msgs = append(msgs, pick[any](g, 5, nil, "m", []any{}))
	}
	e := ev("MESSAGES_SNAPSHOT", "messages", msgs)
	if g.p(0.08) {
		e.set("subagentRunId", g.undeclaredTag())
	}
	g.emit(g.decorate(e))
	g.lanes = map[string]lane{}
}

func (g *seqGen) toolResult() {
	e := ev("TOOL_CALL_RESULT", "messageId", pick(g, "x", "m1", "tr1", "r1"), "toolCallId", g.toolID(), "content", g.choose(vals("ok", "ok", g.parts()), 1), "subagentRunId", g.tag())
	if g.p(0.2) {
		e.set("role", g.choose(vals("tool"), "assistant", nil))
	}
	g.emit(g.decorate(e))
}

func (g *seqGen) encryptedValue() {
	sub := g.choose(vals("tool-call", "message", "message"), "other").(string)
	id := g.msgID()
	if sub == "tool-call" {
		id = g.toolID()
	} else if g.p(0.3) {
		id = g.reasonID()
	}
	g.emit(g.decorate(ev("REASONING_ENCRYPTED_VALUE", "subtype", sub, "entityId", id, "encryptedValue", "e", "subagentRunId", g.tag())))
}

// legacy emits the THINKING_* family (upgraded only in upgrade cases).
func (g *seqGen) legacy() {
	switch {
	case !g.thinking && g.p(g.coherence):
		e := ev("THINKING_START")
		if g.p(0.5) {
			e.set("title", pick[any](g, "t", nil, 5))
		}
		g.emit(g.decorate(g.legacyExtras(e)))
		g.thinking = true
	case g.thinking && !g.thinkingMsg && g.p(g.coherence):
		g.emit(g.decorate(g.legacyExtras(ev("THINKING_TEXT_MESSAGE_START"))))
		g.thinkingMsg = true
	case g.thinkingMsg && g.p(0.6):
		g.emit(g.decorate(g.legacyExtras(ev("THINKING_TEXT_MESSAGE_CONTENT", "delta", pick(g, "x", "")))))
	case g.thinkingMsg:
		g.emit(g.decorate(g.legacyExtras(ev("THINKING_TEXT_MESSAGE_END"))))
		g.thinkingMsg = false
	case g.thinking:
		g.emit(g.decorate(g.legacyExtras(ev("THINKING_END"))))
		g.thinking = false
	default:
		g.emit(g.decorate(ev(pick(g, "THINKING_TEXT_MESSAGE_CONTENT", "THINKING_END", "THINKING_TEXT_MESSAGE_END"), "delta", "x")))
	}
}

// legacyExtras adds fields the upgrade overrides or carries along.
func (g *seqGen) legacyExtras(e Obj) Obj {
	if g.p(0.1) {
		e.set("messageId", pick[any](g, "m1", "", nil))
	}
	if g.p(0.1) {
		e.set("subagentRunId", g.tag())
	}
	if g.p(0.05) {
		e.set("role", pick[any](g, "assistant", "reasoning", nil))
	}
	if g.p(0.05) {
		e.set("delta", pick[any](g, "d", nil))
	}
	return e
}

func (g *seqGen) runFinished() {
	e := ev("RUN_FINISHED", "threadId", "t1", "runId", pick(g, "r1", "r1", "zzz"))
	if g.p(0.25) {
		interrupt := Obj{{"id", "i1"}, {"reason", "r"}}
		if g.p(0.3) {
			interrupt.set("subagentRunId", g.tag())
		}
		e.set("outcome", g.choose(vals(
			Obj{{"type", "success"}},
			Obj{{"type", "success"}, {"pendingToolCallIds", []any{"c1"}}, {"junk", 1}},
			Obj{{"type", "interrupt"}, {"interrupts", []any{interrupt}}},
			Obj{{"type", "cancelled"}}),
			Obj{{"type", "interrupt"}, {"interrupts", []any{}}},
			Obj{{"type", "paused"}},
			nil))
	}
	if g.legacyNull() {
		e.set("outcome", nil)
	}
	if g.p(0.15) {
		e.set("result", g.choose(vals("done", Obj{{"k", 1}}, 0, false), nil))
	}
	if g.legacyNull() {
		e.set("result", nil)
	}
	if g.p(0.1) {
		e.set("usage", []any{Obj{{"inputTokens", g.choose(vals(3, 0, lit("1.0"), lit("9007199254740991")), -1, 1.5, lit("9007199254740992"))}, {"extra", "kept"}}})
	}
	if g.p(0.04) {
		e.set("subagentRunId", g.undeclaredTag())
	}
	g.emit(g.decorate(e))
	g.runOpen = false
	g.lanes = map[string]lane{}
}

// decorate adds envelope fields and unknown keys at random; in upgrade cases it
// also adds the legacy nulls the upgrade removes.
func (g *seqGen) decorate(e Obj) Obj {
	if g.p(0.08) {
		e.set("timestamp", g.choose(vals(1, 0, -5, 1700000000000, lit("9007199254740991"), lit("-9007199254740991"),
			lit("1e3"), lit("1.0"), lit("-0")), lit("9007199254740992"), lit("-9007199254740992"), 1.5, "1", nil, lit("1e400"), lit("1E2"), lit("0.5e1")))
	}
	if g.p(0.06) {
		e.set("metadata", g.choose(vals(Obj{{"k", 1}}, Obj{{"k", nil}}, Obj{}, Obj{{"u", 2}}), nil, []any{}, "m"))
	}
	if g.p(0.06) {
		e.set("rawEvent", pick[any](g, Obj{{"p", 1}}, "s", 0, []any{}, false))
	}
	if g.legacyNull() {
		e.set("rawEvent", nil)
	}
	if g.upgrade && g.p(0.05) {
		if typ, _ := e.get("type"); typ == "TOOL_CALL_START" || typ == "TOOL_CALL_CHUNK" {
			e.set("parentMessageId", nil)
		}
		if typ, _ := e.get("type"); typ == "SUBAGENT_FINISHED" {
			e.set("result", nil)
		}
	}
	if g.p(0.05) {
		// Not "__proto__": JSON.parse keeps it as a key, but zod's output
		// object takes it as its prototype, a JavaScript artefact.
		e.set(pick(g, "extra", "foo", "nested", "constructor", "toString"), pick[any](g, 1, nil, Obj{{"a", []any{1}}}, "v"))
	}
	if g.bad() {
		e.set(pick(g, "messageId", "toolCallName", "delta", "name"), pick[any](g, 1, nil, "v"))
	}
	if g.p(0.03) {
		// Key order is not part of an event.
		g.r.Shuffle(len(e), func(i, j int) { e[i], e[j] = e[j], e[i] })
	}
	return e
}

// duplicateKey repeats a key of one event with another value; JSON.parse keeps
// the last.
func (g *seqGen) duplicateKey() {
	if len(g.events) == 0 {
		return
	}
	i := g.r.IntN(len(g.events))
	e, ok := g.events[i].(Obj)
	if !ok || len(e) == 0 {
		return
	}
	m := e[g.r.IntN(len(e))]
	dup := append(Obj{}, e...)
	dup = append(dup, Member{Key: m.Key, Val: pick[any](g, "z", nil, 7)})
	if g.p(0.5) {
		dup = append(Obj{Member{Key: m.Key, Val: "first"}}, e...)
	}
	g.events[i] = dup
}

// schemaBreak makes one event invalid for the schema (or, for fields that the
// schema does not declare, merely odd).
func (g *seqGen) schemaBreak() {
	if len(g.events) == 0 {
		return
	}
	i := g.r.IntN(len(g.events))
	e, ok := g.events[i].(Obj)
	if !ok {
		return
	}
	e = append(Obj{}, e...)
	if len(e) > 1 && g.p(0.4) {
		e.del(e[1+g.r.IntN(len(e)-1)].Key)
	} else {
		k := e[g.r.IntN(len(e))].Key
		e.set(k, pick[any](g, nil, 5, []any{}, Obj{}, true, "", 1.5))
	}
	g.events[i] = e
}

// nonObject puts a JSON value that is not an object in the sequence.
func (g *seqGen) nonObject() {
	i := g.r.IntN(len(g.events) + 1)
	v := pick[any](g, nil, 5, "RUN_STARTED", []any{Obj{{"type", "RUN_STARTED"}}})
	g.events = append(g.events[:i], append([]any{v}, g.events[i:]...)...)
}
