package thread

import (
	"encoding/json"
	"fmt"
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
func (m Message) MarshalJSON() ([]byte, error) {
	type plain Message
	p := plain(m)
	if p.Parts == nil {
		p.Parts = []Part{}
	}
	return json.Marshal(p)
}

// Part is one part of a message, as @tanstack/ai-client shows it. Type is "text",
// "thinking", "tool-call" or "tool-result" and only the fields of that type are used;
// a part of another type (an image of a user message, say) is kept verbatim in Raw.
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

	ToolCallID   string          // tool-result
	ContentParts json.RawMessage // tool-result: a content that is not a string
	Error        string          // tool-result

	State string // tool-call, tool-result

	Raw json.RawMessage // any other type
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
	w := wirePart{Type: p.Type}
	switch p.Type {
	case "text":
		w.Content = mustJSON(p.Content)
	case "thinking":
		w.Content, w.StepID, w.Signature = mustJSON(p.Content), p.StepID, p.Signature
	case "tool-call":
		w.ID, w.Name, w.Arguments, w.State = &p.ID, &p.Name, &p.Arguments, p.State
		w.Approval, w.Output, w.Input, w.Metadata = p.Approval, p.Output, p.Input, p.Metadata
	case "tool-result":
		w.ToolCallID, w.State, w.Error = &p.ToolCallID, p.State, p.Error
		w.Content = p.ContentParts
		if w.Content == nil {
			w.Content = mustJSON(p.Content)
		}
	default:
		if p.Raw != nil {
			return p.Raw, nil
		}
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a part MarshalJSON wrote.
func (p *Part) UnmarshalJSON(data []byte) error {
	var w wirePart
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*p = Part{Type: w.Type, StepID: w.StepID, Signature: w.Signature, State: w.State,
		Approval: w.Approval, Output: w.Output, Input: w.Input, Metadata: w.Metadata, Error: w.Error}
	str := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	p.ID, p.Name, p.Arguments, p.ToolCallID = str(w.ID), str(w.Name), str(w.Arguments), str(w.ToolCallID)
	if s, ok := asString(w.Content); ok {
		p.Content = s
	} else if p.Type == "tool-result" {
		p.ContentParts = w.Content
	}
	switch p.Type {
	case "text", "thinking", "tool-call", "tool-result":
	default:
		p.Raw = append(json.RawMessage(nil), data...)
	}
	return nil
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
}

// Accept merges a newly accepted run's input (the RunAgentInput JSON as the client posted it)
// into t: messages merge by id, a list ending at an earlier stored id cuts what follows it
// (regenerate), approval answers come from resume, client tool results set their call; the
// interrupts this run answers stop being reported.
func (t *Transcript) Accept(runID string, input json.RawMessage) error {
	var in struct {
		Messages []struct {
			ID      string          `json:"id"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return fmt.Errorf("thread: accept %s: %w", runID, err)
	}
	for _, m := range in.Messages {
		if t.index(m.ID) >= 0 || (m.Role != "user" && m.Role != "system") {
			continue
		}
		s, _ := asString(m.Content)
		t.Messages = append(t.Messages, Message{ID: m.ID, Role: m.Role, Parts: []Part{{Type: "text", Content: s}}})
	}
	return nil
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
// marker to RUN_FINISHED or RUN_ERROR) to t as the client's StreamProcessor would.
func (t *Transcript) Finish(runID string, events []json.RawMessage) error {
	b := newBuilder(runID, t.Messages)
	for _, e := range events {
		if err := b.apply(e); err != nil {
			return fmt.Errorf("thread: finish %s: %w", runID, err)
		}
	}
	if b.last != "RUN_ERROR" {
		b.finalizeStream()
	}
	t.Messages = b.msgs
	return nil
}

// Active returns what a hydrate shows while runID is still running, given its events so far:
// the settled messages plus only the run's latest assistant message, or a "<runID>-pending"
// placeholder for a continuation run with no assistant message yet.
func (t Transcript) Active(runID string, events []json.RawMessage) []Message {
	b := newBuilder(runID, t.Messages)
	for _, e := range events {
		_ = b.apply(e)
	}
	return b.msgs
}

// Page cuts msgs (oldest first) for paging: limit <= 0 means everything and cursor "";
// before is a cursor Page issued (the id of the oldest message of a window). It returns the
// window (oldest first) and the cursor for the next older page, "" when nothing older remains.
func Page(msgs []Message, limit int, before string) (window []Message, cursor string) {
	if limit <= 0 {
		return msgs, ""
	}
	end := len(msgs)
	if before != "" {
		for i := range msgs {
			if msgs[i].ID == before {
				end = i
				break
			}
		}
	}
	start := max(end-limit, 0)
	if start > 0 {
		cursor = msgs[start].ID
	}
	return msgs[start:end], cursor
}
