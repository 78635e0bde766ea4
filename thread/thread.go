package thread

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"

	"github.com/wsgateway/wsgateway/internal/jsonenc"
)

// Message is a UIMessage of @tanstack/ai-client.
type Message struct {
	ID        string          `json:"id"`
	Role      string          `json:"role"`  // user | assistant | system
	Parts     []Part          `json:"parts"` // never nil when marshalled: [] not null
	CreatedAt string          `json:"createdAt,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

// MarshalJSON writes Parts as [] when empty.
func (m Message) MarshalJSON() ([]byte, error) { return m.appendJSON(nil) }

// appendJSON appends m's encoding to b. It writes the parts' encodings itself: through
// encoding/json, every nested MarshalJSON result would be checked and compacted again at each
// level (Part, Message, Transcript, and the value holding the Transcript), which made encoding
// a long thread cost several times its size. What it writes is checked and compacted once, by
// the json.Marshal that encodes the value holding it.
func (m Message) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = jsonenc.String(b, m.ID)
	b = append(b, `,"role":`...)
	b = jsonenc.String(b, m.Role)
	b = append(b, `,"parts":[`...)
	for i, p := range m.Parts {
		if i > 0 {
			b = append(b, ',')
		}
		pb, err := p.MarshalJSON()
		if err != nil {
			return nil, err
		}
		b = append(b, pb...)
	}
	b = append(b, ']')
	if m.CreatedAt != "" {
		b = append(b, `,"createdAt":`...)
		b = jsonenc.String(b, m.CreatedAt)
	}
	if len(m.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = append(b, m.Metadata...)
	}
	return append(b, '}'), nil
}

// Part is one part of a message, as @tanstack/ai-client shows it. Type is "text",
// "thinking", "tool-call" or "tool-result" and only the fields of that type are used;
// a part the builder does not interpret (an image of a user message, say) is kept verbatim
// in Raw, which then is its JSON form.
type Part struct {
	Type string

	Content   string  // text, thinking, tool-result (a string content)
	StepID    *string // thinking (it may be "")
	Signature string  // thinking

	ID        string          // tool-call
	Name      string          // tool-call
	Arguments string          // tool-call: the raw JSON text streamed so far
	Input     json.RawMessage // tool-call: the parsed arguments, once complete
	Output    json.RawMessage // tool-call
	Approval  *Approval       // tool-call
	Metadata  json.RawMessage // tool-call

	ToolCallID   string          // tool-result (ID and Metadata: those of a snapshot's tool message)
	ContentParts json.RawMessage // tool-result: a content that is not a string
	Error        string          // tool-result

	State string // tool-call, tool-result

	Raw json.RawMessage // a part kept verbatim

	// A text part the builder streams into: its content is seg.buf[:segN].
	seg  *segment
	segN int
}

// wirePart is a Part's JSON form: the client's field names, each type with its own.
type wirePart struct {
	Type       string          `json:"type"`
	Content    json.RawMessage `json:"content,omitempty"`
	StepID     *string         `json:"stepId,omitempty"`
	Signature  string          `json:"signature,omitempty"`
	ID         *string         `json:"id,omitempty"`
	Name       *string         `json:"name,omitempty"`
	Arguments  *string         `json:"arguments,omitempty"`
	State      string          `json:"state,omitempty"`
	Approval   *Approval       `json:"approval,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	ToolCallID *string         `json:"toolCallId,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// MarshalJSON writes the part in the client's form.
func (p Part) MarshalJSON() ([]byte, error) {
	if p.Raw == nil && p.Type == "text" { // most parts: what json.Marshal of its wirePart writes
		b := append(make([]byte, 0, len(p.Content)+32), `{"type":"text","content":`...)
		return append(jsonenc.String(b, p.text()), '}'), nil
	}
	w := wirePart{Type: p.Type}
	switch p.Type {
	case "text":
		w.Content = mustJSON(p.text())
	case "thinking":
		w.Content, w.StepID, w.Signature = mustJSON(p.Content), p.StepID, p.Signature
	case "tool-call":
		w.ID, w.Name, w.Arguments, w.State = &p.ID, &p.Name, &p.Arguments, p.State
		w.Approval, w.Output, w.Input, w.Metadata = p.Approval, p.Output, p.Input, p.Metadata
	case "tool-result":
		w.ToolCallID, w.State, w.Error, w.Metadata = &p.ToolCallID, p.State, p.Error, p.Metadata
		if p.ID != "" {
			w.ID = &p.ID
		}
		w.Content = p.ContentParts
		if w.Content == nil {
			w.Content = mustJSON(p.Content)
		}
	}
	if p.Raw != nil {
		return p.Raw, nil
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a part MarshalJSON wrote. A part that the fields of its type do not
// reproduce exactly is kept verbatim in Raw.
func (p *Part) UnmarshalJSON(data []byte) error {
	var w wirePart
	if json.Unmarshal(data, &w) == nil {
		switch w.Type {
		case "text", "thinking", "tool-call", "tool-result":
			q := Part{Type: w.Type, StepID: w.StepID, Signature: w.Signature, State: w.State,
				Approval: w.Approval, Output: w.Output, Input: w.Input, Metadata: w.Metadata, Error: w.Error}
			str := func(s *string) string {
				if s == nil {
					return ""
				}
				return *s
			}
			q.ID, q.Name, q.Arguments, q.ToolCallID = str(w.ID), str(w.Name), str(w.Arguments), str(w.ToolCallID)
			if s, ok := asString(w.Content); ok {
				q.Content = s
			} else if w.Type == "tool-result" {
				q.ContentParts = w.Content
			}
			// A part MarshalJSON wrote (a stored thread's) comes back byte for byte; another
			// form of the same value (a client's key order or spacing) is compared as a value.
			if b, err := q.MarshalJSON(); err == nil && (bytes.Equal(b, data) || sameJSON(b, data)) {
				*p = q
				return nil
			}
		}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	typ, _ := asString(m["type"])
	*p = Part{Type: typ, Raw: append(json.RawMessage(nil), data...)}
	return nil
}

// sameJSON reports whether a and b encode the same value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// Approval is a tool call's approval request and answer.
type Approval struct {
	ID            string `json:"id"`
	NeedsApproval bool   `json:"needsApproval"`
	Approved      *bool  `json:"approved,omitempty"`
}

// Interrupts are the interrupts a paused run asked for.
type Interrupts struct {
	RunID   string            `json:"runId"`   // the paused run
	Pending []json.RawMessage `json:"pending"` // RUN_FINISHED.outcome.interrupts, verbatim
}

// Transcript is a thread's settled state; the zero value is an empty thread. It round-trips
// through encoding/json.
type Transcript struct {
	Messages   []Message   `json:"messages"`
	Interrupts *Interrupts `json:"interrupts,omitempty"`
	// Answered holds the interrupts a running run answered, keyed by that run, to restore them
	// if it fails.
	Answered map[string]*Interrupts `json:"answered,omitempty"`
	// Anchors holds the runs accepted and not finished, in order of acceptance, each with the
	// message its reply goes after (Anchor).
	Anchors []Anchor `json:"anchors,omitempty"`
	// Late holds the answers (an approval's, a client tool's result) that runs posted for
	// calls the transcript did not have yet while runs accepted before them were unfinished:
	// the call is in the reply of such a run, whose finish had not landed. Finish applies
	// them once its messages are in.
	Late []Answers `json:"late,omitempty"`
	// Cut is what the last Accept took out of the transcript, nil when nothing: the caller
	// keeps it as a branch. It is not stored with the transcript.
	Cut *Cut `json:"-"`
}

// Answers are what a run's input answers: its resume entries and its tool rows.
type Answers struct {
	Run      string            `json:"run"`
	Resume   []resumeEntry     `json:"resume,omitempty"`
	ToolRows []json.RawMessage `json:"toolRows,omitempty"`
}

type resumeEntry struct {
	InterruptID string          `json:"interruptId"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

// Anchor is where a run's reply goes: After is the id of the last message of the transcript
// as the run's acceptance left it ("" for an empty transcript), or, once a run accepted
// before it with the same anchor finished, the last message of that run's reply. Finish
// places the run's reply right after it, before the messages later runs added; Context cuts
// the run's context there.
type Anchor struct {
	Run   string `json:"run"`
	After string `json:"after"`
}

// anchor returns runID's anchor, nil when it has none.
func (t *Transcript) anchor(runID string) *Anchor {
	for i := range t.Anchors {
		if t.Anchors[i].Run == runID {
			return &t.Anchors[i]
		}
	}
	return nil
}

// Anchored reports whether runID is a run the transcript holds as accepted and not finished.
func (t *Transcript) Anchored(runID string) bool { return t.anchor(runID) != nil }

// AnchoredAfter returns the runs the transcript holds as accepted and not finished whose
// replies go right after the message id.
func (t *Transcript) AnchoredAfter(id string) []string {
	var runs []string
	for _, a := range t.Anchors {
		if a.After == id {
			runs = append(runs, a.Run)
		}
	}
	return runs
}

// MarshalJSON writes Messages as [] when empty. Like Message's, it writes the messages'
// encodings itself (see appendJSON).
func (t Transcript) MarshalJSON() ([]byte, error) {
	b := []byte(`{"messages":[`)
	for i, m := range t.Messages {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = m.appendJSON(b); err != nil {
			return nil, err
		}
	}
	b = append(b, ']')
	for _, f := range []struct {
		key  string
		v    any
		omit bool
	}{{`,"interrupts":`, t.Interrupts, t.Interrupts == nil}, {`,"answered":`, t.Answered, len(t.Answered) == 0},
		{`,"anchors":`, t.Anchors, len(t.Anchors) == 0}, {`,"late":`, t.Late, len(t.Late) == 0}} {
		if f.omit {
			continue
		}
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		b = append(append(b, f.key...), v...)
	}
	return append(b, '}'), nil
}

// Accept merges a newly accepted run's input (the RunAgentInput JSON as the client posted it)
// into t, never overwriting what t knows:
//
//   - a message with an unknown id is appended (the client may post the whole transcript,
//     only its new messages, or only the new one); a known id keeps t's copy; the wire
//     form carries a message's metadata but for metadata.tanstack, which holds only the
//     message's createdAt there;
//   - a list whose last user, system or assistant message is a stored one followed by others
//     cuts those others (a regenerate);
//   - resume entries whose payload has a boolean "approved" answer the approval with that
//     interruptId (approval.approved, state approval-responded), and the wire's synthesized
//     tool row of an approval is ignored;
//   - a tool row for a call without approval that has no output yet (a client tool's result)
//     sets the call's output and state complete and adds a tool-result part;
//   - if resume answers one of t.Interrupts, they stop being reported; Finish restores them
//     if this run fails;
//   - an answer (an approval's, a tool row) whose call t does not have while a run accepted
//     before is unfinished is kept (Late): Finish applies it once that run's messages are in;
//   - the run's anchor is the transcript's last message now (Anchors).
func (t *Transcript) Accept(runID string, input json.RawMessage) error {
	var in struct {
		Messages []wireMessage `json:"messages"`
		Resume   []resumeEntry `json:"resume"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return fmt.Errorf("thread: accept %s: %w", runID, err)
	}

	// Regenerate: the last anchor of the list is stored, and followed by more; edit: it is a
	// stored user message whose text the list changes. What followed it (an edit: it and what
	// followed) leaves the transcript as a branch (Cut).
	t.Cut = nil
	for i := len(in.Messages) - 1; i >= 0; i-- {
		m := in.Messages[i]
		if m.Role != "user" && m.Role != "system" && m.Role != "assistant" {
			continue
		}
		if at := t.index(m.ID); at >= 0 && m.Role == "user" && edited(t.Messages[at], m) {
			t.cut(at, runID)
		} else if at >= 0 && at < len(t.Messages)-1 {
			t.cut(at+1, "")
		}
		break
	}

	// Approval answers, before tool rows: an answered call's row is the wire's own.
	late := Answers{Run: runID}
	if !t.approve(in.Resume) {
		late.Resume = in.Resume
	}

	// The client names a message created lazily at random: an assistant message with an
	// unknown id is the client's copy of the next message t minted an id for, after the
	// last one the list matched so far, or of the message that has its tool calls.
	pos := -1
	matched := map[int]bool{}
	for _, m := range in.Messages {
		if m.Role == "tool" || m.Role == "reasoning" {
			// Rows of an assistant message, not messages.
		} else if at := t.indexAfter(m.ID, pos); at >= 0 {
			pos = at
		} else if m.Role == "assistant" {
			if at := t.lazyCopy(pos, matched, m.ToolCalls); at >= 0 {
				matched[at] = true
				pos = max(pos, at)
				continue
			}
		}
		switch m.Role {
		case "tool":
			if !t.clientToolResult(m.ToolCallID, m.Content) {
				late.ToolRows = append(late.ToolRows, mustJSON(m))
			}
			continue
		case "user", "system", "assistant":
		default:
			continue
		}
		if m.ID == "" || t.index(m.ID) >= 0 {
			continue
		}
		msg := Message{ID: m.ID, Role: m.Role, Parts: []Part{}}
		msg.CreatedAt, msg.Metadata = wireMetadata(m.Metadata)
		if s, ok := asString(m.Content); ok {
			if s != "" || m.Role == "user" {
				msg.Parts = append(msg.Parts, Part{Type: "text", Content: s})
			}
		} else if len(m.Content) > 0 && m.Content[0] == '[' {
			msg.Parts = append(msg.Parts, userParts(m.Content)...)
		}
		for _, c := range m.ToolCalls {
			msg.Parts = append(msg.Parts, Part{Type: "tool-call", ID: c.ID, Name: c.Function.Name,
				Arguments: c.Function.Arguments, State: "input-complete", Input: parseJSON(c.Function.Arguments)})
		}
		t.Messages = append(t.Messages, msg)
	}

	t.answered(runID, in.Resume)
	if len(t.Anchors) > 0 && (late.Resume != nil || late.ToolRows != nil) {
		t.Late = append(t.Late, late) // an unfinished run may be making the call
	}
	a := Anchor{Run: runID}
	if n := len(t.Messages); n > 0 {
		a.After = t.Messages[n-1].ID
	}
	t.dropAnchor(runID) // a resubmit is accepted anew
	t.Anchors = append(t.Anchors, a)
	return nil
}

// Cut is what a regenerate or an edit took out of a transcript (Transcript.Accept): the
// messages that followed After ("" for the transcript's start), a branch that the thread keeps
// beside the one the run continues (docs/THREADS.md section 7).
type Cut struct {
	After    string
	Messages []Message
}

// cut moves t's messages from position at on into t.Cut. An edit (editRun set) keeps the
// edited message's id for the new text: the copy cut gets "<id>~<editRun>".
func (t *Transcript) cut(at int, editRun string) {
	c := &Cut{Messages: slices.Clone(t.Messages[at:])}
	if at > 0 {
		c.After = t.Messages[at-1].ID
	}
	if editRun != "" {
		c.Messages[0].ID += "~" + editRun
	}
	t.Messages = t.Messages[:at:at]
	t.Cut = c
}

// edited reports whether the wire message posted under stored's id changes its text.
func edited(stored Message, posted wireMessage) bool {
	text, ok := asString(posted.Content)
	if !ok {
		if len(posted.Content) == 0 || posted.Content[0] != '[' {
			return false
		}
		text = joinText(userParts(posted.Content))
	}
	return text != joinText(stored.Parts)
}

// approve applies resume's approval answers (payload.approved) to the calls whose approval
// they name, and reports whether each found its call.
func (t *Transcript) approve(resume []resumeEntry) bool {
	all := true
	for _, r := range resume {
		var p struct {
			Approved *bool `json:"approved"`
		}
		if json.Unmarshal(r.Payload, &p) != nil || p.Approved == nil {
			continue
		}
		found := false
		t.eachCall(func(p *Part) bool { return p.Approval != nil && p.Approval.ID == r.InterruptID }, func(_ *Message, part *Part) {
			found = true
			v := *p.Approved
			a := *part.Approval
			a.Approved = &v
			part.Approval = &a
			part.State, part.Raw = "approval-responded", nil
		})
		all = all && found
	}
	return all
}

// answered stops reporting t.Interrupts when resume answers one of them, keeping them for
// Finish to restore if runID fails.
func (t *Transcript) answered(runID string, resume []resumeEntry) {
	if t.Interrupts == nil {
		return
	}
	for _, raw := range t.Interrupts.Pending {
		id, _ := asString(object(raw)["id"])
		if slices.ContainsFunc(resume, func(r resumeEntry) bool { return r.InterruptID == id }) {
			if t.Answered == nil {
				t.Answered = map[string]*Interrupts{}
			}
			t.Answered[runID] = t.Interrupts
			t.Interrupts = nil
			return
		}
	}
}

// applyLate applies the late answers that find their calls now, and keeps the others while
// a run that may make them is unfinished.
func (t *Transcript) applyLate() {
	var keep []Answers
	for _, a := range t.Late {
		if a.Resume != nil && t.approve(a.Resume) {
			t.answered(a.Run, a.Resume)
			a.Resume = nil
		}
		var rows []json.RawMessage
		for _, raw := range a.ToolRows {
			var m wireMessage
			if json.Unmarshal(raw, &m) == nil && !t.clientToolResult(m.ToolCallID, m.Content) {
				rows = append(rows, raw)
			}
		}
		a.ToolRows = rows
		if len(t.Anchors) > 0 && (a.Resume != nil || a.ToolRows != nil) {
			keep = append(keep, a)
		}
	}
	t.Late = keep
}

// dropAnchor forgets runID's anchor.
func (t *Transcript) dropAnchor(runID string) {
	t.Anchors = slices.DeleteFunc(t.Anchors, func(a Anchor) bool { return a.Run == runID })
	if len(t.Anchors) == 0 {
		t.Anchors = nil
	}
}

// split returns the messages of t up to runID's anchor and those after it (added by runs
// accepted later); all of them and none when runID has no anchor, or its anchor is gone (a
// regenerate cut it).
func (t *Transcript) split(runID string) (head, tail []Message) {
	a := t.anchor(runID)
	if a == nil {
		return t.Messages, nil
	}
	at := -1
	if a.After != "" {
		if at = t.index(a.After); at < 0 {
			return t.Messages, nil
		}
	}
	return t.Messages[:at+1], t.Messages[at+1:]
}

// wireMessage is a message of a RunAgentInput as @tanstack/ai-client posts it.
type wireMessage struct {
	ID         string          `json:"id"`
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"toolCallId"`
	ToolCalls  []wireCall      `json:"toolCalls"`
	Metadata   json.RawMessage `json:"metadata"`
}

type wireCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// wireMetadata splits a posted message's metadata into the createdAt the client
// put in metadata.tanstack.createdAt and the message's own metadata (nil when
// nothing else is left).
func wireMetadata(raw json.RawMessage) (createdAt string, metadata json.RawMessage) {
	md := object(raw)
	if md == nil {
		return "", nil
	}
	if tanstack := object(md["tanstack"]); tanstack != nil {
		createdAt = coerceCreatedAt(tanstack["createdAt"])
		delete(tanstack, "createdAt")
		if len(tanstack) == 0 {
			delete(md, "tanstack")
		} else {
			md["tanstack"] = mustJSON(tanstack)
		}
	}
	if len(md) == 0 {
		return createdAt, nil
	}
	return createdAt, mustJSON(md)
}

// indexAfter returns the index of the first message with the id after index
// pos, else of the first one, else -1.
func (t *Transcript) indexAfter(id string, pos int) int {
	for i := pos + 1; i < len(t.Messages); i++ {
		if t.Messages[i].ID == id {
			return i
		}
	}
	return t.index(id)
}

// lazyCopy returns the index of the message of t that an assistant message of the wire
// with an unknown id stands for: the message that has one of its tool calls, else the first
// assistant message after pos with an id Finish minted that no other wire message took; -1
// when there is none (the message is new).
func (t *Transcript) lazyCopy(pos int, matched map[int]bool, calls []wireCall) int {
	for _, c := range calls {
		for i, m := range t.Messages {
			for _, p := range m.Parts {
				if p.Type == "tool-call" && p.ID == c.ID {
					return i
				}
			}
		}
	}
	for i := pos + 1; i < len(t.Messages); i++ {
		if m := t.Messages[i]; !matched[i] && m.Role == "assistant" && minted.MatchString(m.ID) {
			return i
		}
	}
	return -1
}

// minted matches the ids Finish mints for messages ("<runId>-a<n>").
var minted = regexp.MustCompile(`-a[0-9]+$`)

// userParts converts the wire's content parts: text parts become text parts
// ({"type":"text","text"} on the wire), others are kept verbatim.
func userParts(raw json.RawMessage) []Part {
	var list []json.RawMessage
	_ = json.Unmarshal(raw, &list)
	var parts []Part
	for _, p := range list {
		o := object(p)
		if typ, _ := asString(o["type"]); typ == "text" {
			s, _ := asString(o["text"])
			parts = append(parts, Part{Type: "text", Content: s})
			continue
		}
		if typ, _ := asString(o["type"]); typ != "binary" {
			parts = append(parts, Part{Type: typ, Raw: p})
		}
	}
	return parts
}

// eachCall calls f on every tool-call part that match selects.
func (t *Transcript) eachCall(match func(*Part) bool, f func(*Message, *Part)) {
	for i := range t.Messages {
		for j := range t.Messages[i].Parts {
			if p := &t.Messages[i].Parts[j]; p.Type == "tool-call" && match(p) {
				f(&t.Messages[i], p)
			}
		}
	}
}

// clientToolResult applies a tool row of the wire to a call that waits for
// its client tool's result (ChatClient's addToolResult): a call without
// approval, output or result part. It reports whether t has the call.
func (t *Transcript) clientToolResult(callID string, content json.RawMessage) (found bool) {
	for _, m := range t.Messages {
		for _, p := range m.Parts {
			if p.Type == "tool-result" && p.ToolCallID == callID {
				return true // the wire's row of a result t has
			}
		}
	}
	done := false
	t.eachCall(func(p *Part) bool { return p.ID == callID }, func(m *Message, p *Part) {
		if done || p.Approval != nil || p.Output != nil || p.State == "complete" || p.State == "error" {
			done = true
			return
		}
		done = true
		s, ok := asString(content)
		if !ok {
			return
		}
		p.Raw = nil
		p.Output = parseJSON(s)
		if p.Output == nil {
			p.Output = content
		}
		p.State = "complete"
		r := Part{Type: "tool-result", ToolCallID: callID, Content: s, State: "complete"}
		for i := range m.Parts {
			if m.Parts[i].Type == "tool-result" && m.Parts[i].ToolCallID == callID {
				m.Parts[i] = r
				return
			}
		}
		m.Parts = append(m.Parts, r)
	})
	return done
}

func (t *Transcript) index(id string) int {
	for i := range t.Messages {
		if t.Messages[i].ID == id {
			return i
		}
	}
	return -1
}

// Finish applies the run's stored events (its log in order, from the gateway's run.accepted
// marker to RUN_FINISHED or RUN_ERROR) to t as the client's StreamProcessor would. A
// RUN_FINISHED with an interrupt outcome sets t.Interrupts (the run's interrupts, verbatim);
// a run that ends with RUN_ERROR restores the interrupts it answered.
//
// The run's messages go right after its anchor (the transcript's end at its acceptance),
// before the messages of runs accepted after it: a reply whose finish lands after the next
// run's acceptance is still placed after its own question. A message those later runs posted
// that the run built itself (a client that posted the reply with the id this gateway gave it
// before its finish landed) is kept once, as built.
func (t *Transcript) Finish(runID string, events []json.RawMessage) error {
	return t.finish(runID, events, false)
}

// FinishContext is Finish for a transcript that only gives a later run's agent its context
// (Context, then AgentMessages), which reads no message's metadata nor createdAt: the run's
// events' metadata is not merged into its messages (their Metadata, and a createdAt from
// metadata.tanstack, are left as they were). That merge decodes and encodes the message's
// metadata at each event, most of the cost of a reply streamed as many deltas that carry
// metadata, and a run's start pays it for each earlier run it applies (THREADS.md section 5).
// Everything else, the messages' ids, roles and parts, the anchors and interrupts, is as
// Finish leaves it. A transcript so finished must not be stored.
func (t *Transcript) FinishContext(runID string, events []json.RawMessage) error {
	return t.finish(runID, events, true)
}

func (t *Transcript) finish(runID string, events []json.RawMessage, noMetadata bool) error {
	head, tail := t.split(runID)
	b := newBuilder(runID, head)
	b.noMetadata = noMetadata
	for _, e := range events {
		if err := b.apply(e); err != nil {
			return fmt.Errorf("thread: finish %s: %w", runID, err)
		}
	}
	if b.last != "RUN_ERROR" {
		b.finalizeStream()
	}
	settle(b.msgs)
	built := len(b.msgs)
	for _, m := range tail {
		if b.find(m.ID) == nil {
			b.msgs = append(b.msgs, m)
		}
	}
	t.Messages = b.msgs
	// The runs accepted after this one at the same place now follow its reply.
	if a := t.anchor(runID); a != nil && built > len(head) {
		last, later := b.msgs[built-1].ID, false
		for i := range t.Anchors {
			if t.Anchors[i].Run == runID {
				later = true
			} else if later && t.Anchors[i].After == a.After {
				t.Anchors[i].After = last
			}
		}
	}
	t.dropAnchor(runID)
	answered := t.Answered[runID]
	delete(t.Answered, runID)
	if len(t.Answered) == 0 {
		t.Answered = nil
	}
	switch b.last {
	case "RUN_ERROR":
		if answered != nil {
			t.Interrupts = answered
		}
	case "RUN_FINISHED":
		if pending := b.interrupts; len(pending) > 0 {
			t.Interrupts = &Interrupts{RunID: runID, Pending: pending}
		}
	}
	t.applyLate()
	return nil
}

// Withdraw takes runID out of t as if it had never been accepted (multitaskStrategy
// rollback, THREADS.md section 6): the messages ids names (those its acceptance added, and
// its reply's if its finish was applied) leave the transcript, its anchor and late answers
// go, a run anchored after a message that leaves is anchored where that message was, and
// the interrupts it answered are reported again.
func (t *Transcript) Withdraw(runID string, ids []string) {
	gone := make(map[string]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
	}
	kept := t.Messages[:0:0]
	moved := map[string]string{} // a message that leaves → the one kept before it
	prev := ""
	for _, m := range t.Messages {
		if gone[m.ID] {
			moved[m.ID] = prev
			continue
		}
		kept = append(kept, m)
		prev = m.ID
	}
	t.Messages = kept
	t.dropAnchor(runID)
	for i := range t.Anchors {
		if to, ok := moved[t.Anchors[i].After]; ok {
			t.Anchors[i].After = to
		}
	}
	t.Late = slices.DeleteFunc(t.Late, func(a Answers) bool { return a.Run == runID })
	if len(t.Late) == 0 {
		t.Late = nil
	}
	if answered := t.Answered[runID]; answered != nil {
		t.Interrupts = answered
		delete(t.Answered, runID)
		if len(t.Answered) == 0 {
			t.Answered = nil
		}
	}
}

// IDs returns the ids of t's messages.
func (t *Transcript) IDs() map[string]bool {
	ids := make(map[string]bool, len(t.Messages))
	for _, m := range t.Messages {
		ids[m.ID] = true
	}
	return ids
}

// Active returns what a hydrate shows while runID is still running, given its events so far:
// the settled messages (with the run's user message) plus only the run's latest assistant
// message (the client drops a trailing assistant message when the replay starts, and
// rebuilds it), or, for a continuation run (its input added no user message) with no
// assistant message yet, a placeholder {id: "<runID>-pending", role: "assistant", parts: []}
// for the client to drop instead of the message that asked.
func (t Transcript) Active(runID string, events []json.RawMessage) []Message {
	b := newBuilder(runID, t.Messages)
	for _, e := range events {
		_ = b.apply(e)
	}
	settle(b.msgs)
	out := append([]Message(nil), t.Messages...)
	for i := len(b.msgs) - 1; i >= 0; i-- {
		if m := b.msgs[i]; m.Role == "assistant" && t.index(m.ID) < 0 {
			return append(out, m)
		}
	}
	if n := len(t.Messages); n > 0 && t.Messages[n-1].Role != "user" {
		out = append(out, Message{ID: runID + "-pending", Role: "assistant", Parts: []Part{}})
	}
	return out
}

// MaxPage is the largest page Page answers.
const MaxPage = 500

// Page cuts msgs (oldest first) for paging: limit <= 0 means everything and cursor "";
// a larger limit than MaxPage counts as MaxPage. before is "" for the newest window, or a
// cursor Page issued (the id of the oldest message of a window): the window (never nil) is then the
// newest limit messages strictly older than it. It returns the window (oldest first) and the
// cursor for the next older page, "" when nothing older remains. A cursor naming no message
// of msgs (one cut by a regenerate since) answers an empty window and "".
func Page(msgs []Message, limit int, before string) (window []Message, cursor string) {
	if msgs == nil {
		msgs = []Message{}
	}
	if limit <= 0 {
		return msgs, ""
	}
	limit = min(limit, MaxPage)
	end := len(msgs)
	if before != "" {
		end = -1
		for i := range msgs {
			if msgs[i].ID == before {
				end = i
				break
			}
		}
		if end < 0 {
			return []Message{}, ""
		}
	}
	start := max(end-limit, 0)
	if start > 0 {
		cursor = msgs[start].ID
	}
	return msgs[start:end], cursor
}
