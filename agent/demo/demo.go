// Package demo is the gateway's built-in agent: deterministic, no network. It is what
// `wsgateway` answers with by default, and the producer the tests use.
//
// Agent.Run reads the options object forwardedProps.demo of the run frame (all fields
// optional; an unknown field or a wrong type is an error):
//
//	(none)                    reply "You said: <text of the last user message>", one word
//	                          per TEXT_MESSAGE_CONTENT, 20 ms apart
//	tokens (int)              reply with exactly tokens deltas instead; delta i (from 1)
//	                          is "t<i> "
//	intervalMs (int)          pause between two events (default 20; 0 = as fast as possible)
//	chunked (bool)            TEXT_MESSAGE_CHUNKs instead of TEXT_MESSAGE_START/CONTENT/END
//	reasoning (bool)          a reasoning span with one reasoning message before the reply
//	toolCall (bool)           a get_weather tool call, its JSON arguments in several
//	                          deltas, before the reply
//	runs (int)                an agent loop: that many RUN_STARTED…RUN_FINISHED runs
//	fail ("start"|"middle")   fail before the first event, or after half of them
//	invalid (bool)            after half of the events, a TEXT_MESSAGE_CONTENT for a message
//	                          that was never started (a protocol violation), then the rest
//
// Each run of the turn is: RUN_STARTED{threadId, runId} (the frame's), the reasoning span, the
// tool call, the reply message, RUN_FINISHED{threadId, runId}. Ids derive from the runId and
// the run's number k (from 1), so the events of a frame are predictable:
// "<runId>.reasoning<k>" (span), "<runId>.thought<k>" (reasoning message), "<runId>.call<k>"
// (tool call), "<runId>.msg<k>" (reply). The events carry no timestamps.
//
// Run honours ctx: it stops within one pause after ctx is cancelled and returns ctx's error.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode"

	"github.com/wsgateway/wsgateway/protocol"
)

// Errors returned by Run. Compare with errors.Is.
var (
	// ErrInjected is the failure requested with fail "start" or "middle".
	ErrInjected = errors.New("demo: injected failure")
	// ErrOptions reports an invalid forwardedProps.demo.
	ErrOptions = errors.New("demo: invalid forwardedProps.demo")
)

// Bounds of the options, so one frame cannot ask for an endless turn.
const (
	MaxTokens     = 1_000_000
	MaxIntervalMs = 60_000
	MaxRuns       = 100
)

// DefaultInterval is the pause between events when intervalMs is absent.
const DefaultInterval = 20 * time.Millisecond

// ToolName is the name of the tool call emitted with toolCall.
const ToolName = "get_weather"

// toolArgs are the tool call's argument deltas; together they are one JSON object.
var toolArgs = []string{`{"city":`, `"Paris",`, `"unit":"celsius"`, `}`}

// reasoningText is the reasoning message's text, one word per delta.
const reasoningText = "The user wants a reply; I will answer."

// Options is forwardedProps.demo. Pointer fields tell absent from zero.
type Options struct {
	Tokens     *int   `json:"tokens,omitempty"`
	IntervalMs *int   `json:"intervalMs,omitempty"`
	Chunked    bool   `json:"chunked,omitempty"`
	Reasoning  bool   `json:"reasoning,omitempty"`
	ToolCall   bool   `json:"toolCall,omitempty"`
	Runs       *int   `json:"runs,omitempty"`
	Fail       string `json:"fail,omitempty"`
	Invalid    bool   `json:"invalid,omitempty"`
}

// Agent is the demo agent. The zero value is ready to use and safe for concurrent turns.
type Agent struct{}

// New returns a demo agent.
func New() *Agent { return &Agent{} }

// Run emits the turn's events for in, pausing between them, and returns nil when they are all
// emitted. It returns ErrOptions for bad options, ErrInjected when asked to fail, the emit
// error wrapped when emit refuses an event, and ctx's error when ctx is cancelled.
func (a *Agent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error {
	opts, err := parseOptions(in.ForwardedProps)
	if err != nil {
		return err
	}
	s := newScript(in.ThreadID, in.RunID, lastUserText(in), opts)
	if opts.Fail == "start" {
		return fmt.Errorf("%w at start", ErrInjected)
	}
	interval := DefaultInterval
	if opts.IntervalMs != nil {
		interval = time.Duration(*opts.IntervalMs) * time.Millisecond
	}
	half := -1 // the index of the event before which to fail or misbehave
	if opts.Fail == "middle" || opts.Invalid {
		half = s.count() / 2
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	i := 0
	for ev := range s.events {
		if i > 0 && interval > 0 {
			if timer == nil {
				timer = time.NewTimer(interval)
			} else {
				timer.Reset(interval)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("demo: %w", ctx.Err())
			case <-timer.C:
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if i == half {
			if opts.Fail == "middle" {
				return fmt.Errorf("%w midway, after %d events", ErrInjected, half)
			}
			if opts.Invalid {
				bad := event{Type: "TEXT_MESSAGE_CONTENT", MessageID: s.runID + ".never-started", Delta: ptr("x")}
				if err := emit(bad.encode()); err != nil {
					return fmt.Errorf("demo: emit: %w", err)
				}
			}
		}
		if err := emit(ev.encode()); err != nil {
			return fmt.Errorf("demo: emit: %w", err)
		}
		i++
	}
	return nil
}

// parseOptions decodes forwardedProps.demo strictly and checks the bounds.
func parseOptions(forwardedProps json.RawMessage) (Options, error) {
	var opts Options
	if len(forwardedProps) == 0 {
		return opts, nil
	}
	var props struct {
		Demo json.RawMessage `json:"demo"`
	}
	if err := json.Unmarshal(forwardedProps, &props); err != nil {
		// forwardedProps that is not an object carries no demo options.
		return opts, nil
	}
	if len(props.Demo) == 0 || bytes.Equal(props.Demo, []byte("null")) {
		return opts, nil
	}
	dec := json.NewDecoder(bytes.NewReader(props.Demo))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&opts); err != nil {
		return opts, fmt.Errorf("%w: %v", ErrOptions, err)
	}
	bad := func(format string, args ...any) (Options, error) {
		return opts, fmt.Errorf("%w: "+format, append([]any{ErrOptions}, args...)...)
	}
	switch {
	case opts.Tokens != nil && (*opts.Tokens < 0 || *opts.Tokens > MaxTokens):
		return bad("tokens %d out of 0..%d", *opts.Tokens, MaxTokens)
	case opts.IntervalMs != nil && (*opts.IntervalMs < 0 || *opts.IntervalMs > MaxIntervalMs):
		return bad("intervalMs %d out of 0..%d", *opts.IntervalMs, MaxIntervalMs)
	case opts.Runs != nil && (*opts.Runs < 1 || *opts.Runs > MaxRuns):
		return bad("runs %d out of 1..%d", *opts.Runs, MaxRuns)
	case opts.Fail != "" && opts.Fail != "start" && opts.Fail != "middle":
		return bad(`fail %q: want "start" or "middle"`, opts.Fail)
	}
	return opts, nil
}

// lastUserText returns the text of the last user message (protocol.Message.Text).
func lastUserText(in *protocol.RunAgentInput) string {
	for i := len(in.Messages) - 1; i >= 0; i-- {
		if m := in.Messages[i]; m.Role == "user" {
			return m.Text()
		}
	}
	return ""
}

// reply returns the deltas of the reply to a user text: "You said: <text>" cut before each
// word that follows whitespace, so the deltas are one word each (with the whitespace before
// it) and concatenate to exactly the reply.
func reply(text string) []string {
	return splitWords("You said: " + text)
}

func splitWords(s string) []string {
	var out []string
	start, gap := 0, -1 // gap: where the whitespace after the current word began
	word := false
	for i, r := range s {
		if unicode.IsSpace(r) {
			if word && gap < 0 {
				gap = i
			}
			continue
		}
		if gap >= 0 {
			out = append(out, s[start:gap])
			start, gap = gap, -1
		}
		word = true
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// script is the sequence of events of one turn, without the injected failure or violation.
type script struct {
	threadID, runID string
	opts            Options
	userText        string
}

func newScript(threadID, runID, userText string, opts Options) *script {
	return &script{threadID: threadID, runID: runID, opts: opts, userText: userText}
}

func (s *script) runs() int {
	if s.opts.Runs != nil {
		return *s.opts.Runs
	}
	return 1
}

// deltas yields the reply's deltas, generated lazily (tokens may be large).
func (s *script) deltas(yield func(string) bool) {
	if s.opts.Tokens == nil {
		for _, d := range reply(s.userText) {
			if !yield(d) {
				return
			}
		}
		return
	}
	for i := 1; i <= *s.opts.Tokens; i++ {
		if !yield("t" + strconv.Itoa(i) + " ") {
			return
		}
	}
}

// count returns the number of events the script yields.
func (s *script) count() int {
	n := 0
	for range s.events {
		n++
	}
	return n
}

// events yields the turn's events in order.
func (s *script) events(yield func(event) bool) {
	for k := 1; k <= s.runs(); k++ {
		if !s.run(k, yield) {
			return
		}
	}
}

// run yields the events of the k-th run of the turn; false when yield stopped it.
func (s *script) run(k int, yield func(event) bool) bool {
	id := func(kind string) string { return s.runID + "." + kind + strconv.Itoa(k) }
	if !yield(event{Type: "RUN_STARTED", ThreadID: s.threadID, RunID: s.runID}) {
		return false
	}
	if s.opts.Reasoning {
		span, msg := id("reasoning"), id("thought")
		if !yield(event{Type: "REASONING_START", MessageID: span}) ||
			!yield(event{Type: "REASONING_MESSAGE_START", MessageID: msg, Role: "reasoning"}) {
			return false
		}
		for _, d := range splitWords(reasoningText) {
			if !yield(event{Type: "REASONING_MESSAGE_CONTENT", MessageID: msg, Delta: ptr(d)}) {
				return false
			}
		}
		if !yield(event{Type: "REASONING_MESSAGE_END", MessageID: msg}) ||
			!yield(event{Type: "REASONING_END", MessageID: span}) {
			return false
		}
	}
	if s.opts.ToolCall {
		call := id("call")
		if !yield(event{Type: "TOOL_CALL_START", ToolCallID: call, ToolCallName: ToolName}) {
			return false
		}
		for _, d := range toolArgs {
			if !yield(event{Type: "TOOL_CALL_ARGS", ToolCallID: call, Delta: ptr(d)}) {
				return false
			}
		}
		if !yield(event{Type: "TOOL_CALL_END", ToolCallID: call}) {
			return false
		}
	}
	msg := id("msg")
	if s.opts.Chunked {
		first := true
		for d := range s.deltas {
			ev := event{Type: "TEXT_MESSAGE_CHUNK", MessageID: msg, Delta: ptr(d)}
			if first {
				ev.Role, first = "assistant", false
			}
			if !yield(ev) {
				return false
			}
		}
		if first && !yield(event{Type: "TEXT_MESSAGE_CHUNK", MessageID: msg, Role: "assistant"}) {
			return false
		}
	} else {
		if !yield(event{Type: "TEXT_MESSAGE_START", MessageID: msg, Role: "assistant"}) {
			return false
		}
		for d := range s.deltas {
			if !yield(event{Type: "TEXT_MESSAGE_CONTENT", MessageID: msg, Delta: ptr(d)}) {
				return false
			}
		}
		if !yield(event{Type: "TEXT_MESSAGE_END", MessageID: msg}) {
			return false
		}
	}
	return yield(event{Type: "RUN_FINISHED", ThreadID: s.threadID, RunID: s.runID})
}

// event is one AG-UI event the demo emits; the field order is the wire order.
type event struct {
	Type         string  `json:"type"`
	ThreadID     string  `json:"threadId,omitempty"`
	RunID        string  `json:"runId,omitempty"`
	MessageID    string  `json:"messageId,omitempty"`
	Role         string  `json:"role,omitempty"`
	ToolCallID   string  `json:"toolCallId,omitempty"`
	ToolCallName string  `json:"toolCallName,omitempty"`
	Delta        *string `json:"delta,omitempty"`
}

func (e event) encode() []byte {
	b, err := json.Marshal(e)
	if err != nil {
		panic("demo: encoding an event: " + err.Error()) // strings only: cannot fail
	}
	return b
}

func ptr(s string) *string { return &s }
