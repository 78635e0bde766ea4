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
//	intervalMs (int)          time between two events (default 20; 0 = as fast as possible):
//	                          event i is due i intervals after the first, so a late event
//	                          does not delay the ones after it
//	chunked (bool)            TEXT_MESSAGE_CHUNKs instead of TEXT_MESSAGE_START/CONTENT/END
//	reasoning (bool)          a reasoning span with one reasoning message before the reply
//	toolCall (bool)           a get_weather tool call, its JSON arguments in several
//	                          deltas, before the reply
//	runs (int)                an agent loop: that many RUN_STARTED…RUN_FINISHED runs
//	fail ("start"|"middle")   fail before the first event, or after half of them
//	invalid (bool)            after half of the events, a TEXT_MESSAGE_CONTENT for a message
//	                          that was never started (a protocol violation), then the rest
//	timestamps (bool)         every event carries "timestamp": the wall-clock time of its
//	                          emit in whole milliseconds since the Unix epoch, rounded down,
//	                          and, but on chunks, "metadata":{"emitMicros":…}, the same
//	                          in microseconds
//	approval (bool)           after the reply, a get_weather tool call that needs the user's
//	                          approval: the run ends RUN_FINISHED with an interrupt outcome,
//	                          one interrupt {id "<call id>.approval", reason
//	                          "approval_required", toolCallId, metadata {kind "approval",
//	                          toolName, input}} (the shape @tanstack/ai-client answers)
//	usage (bool)              every RUN_FINISHED carries "usage":[{"model":"demo",
//	                          "inputTokens":<words of the last user message>,
//	                          "outputTokens":<content deltas of the run's reply>,
//	                          "totalTokens":<their sum>}], a deterministic usage for
//	                          tests of metering and budgets
//
// Each run of the turn is: RUN_STARTED{threadId, runId} (the frame's), TEXT_MESSAGE_START of
// the reply, the reasoning span, the tool call, the reply's content and TEXT_MESSAGE_END,
// RUN_FINISHED{threadId, runId}. The reply starts first so that a client rebuilding the run
// from a replay (a reload mid-turn) has a message to put the reasoning in. With chunked, the
// reply is chunks after the reasoning and the tool call. Ids derive from the runId and the
// run's number k (from 1), so the events of a frame are predictable: "<runId>.reasoning<k>"
// (span), "<runId>.thought<k>" (reasoning message), "<runId>.call<k>" (tool call),
// "<runId>.msg<k>" (reply). Every TEXT_MESSAGE_START carries
// "metadata":{"tanstack":{"createdAt":…}}, the time of its emit as an ISO 8601 string in
// milliseconds (UTC), which @tanstack/ai-client takes as the message's createdAt. The events
// carry no timestamp unless timestamps is set.
//
// A run frame whose resume answers an approval (resume[0].interruptId, as the approval run
// named it; parentRunId the paused run) is a continuation: RUN_STARTED{threadId, runId,
// parentRunId}, then, when resume[0] is resolved with payload.approved true, a
// TOOL_CALL_RESULT of the approved call ("<runId>.result1") and the reply "Approved: it is 18
// °C in Paris."; otherwise the reply "Declined: I did not check the weather."; then
// RUN_FINISHED. The options apply to it as to any turn, approval excepted. AG-UI 1.0 requires an integer timestamp (a fraction is a schema error), hence whole
// milliseconds: a client measuring emit-to-receipt latency from it would over-estimate by up
// to one millisecond, so the microseconds go in the event's metadata, which AG-UI leaves to
// the application. Chunks carry no metadata: a chunk's metadata changes what it expands
// into (a continuation without delta would become an empty delta). Chunk expansion never
// copies a timestamp, so with chunked the events a gateway expands the chunks into carry
// none.
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
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/wsgateway/wsgateway/agent"
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
	Timestamps bool   `json:"timestamps,omitempty"`
	Approval   bool   `json:"approval,omitempty"`
	Usage      bool   `json:"usage,omitempty"`
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
	if len(in.Resume) > 0 {
		s.answer = answerOf(in)
	}
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
	// buf holds one encoded event at a time: emit does not keep the slice after it returns.
	var buf []byte
	send := func(ev *event) error {
		var at time.Time
		if opts.Timestamps {
			at = time.Now()
		}
		if ev.typ == "TEXT_MESSAGE_START" {
			ev.createdAt = time.Now().UTC().Format(isoMillis)
		}
		buf = ev.appendJSON(buf[:0], at)
		if err := emit(buf); err != nil {
			return fmt.Errorf("demo: emit: %w", err)
		}
		return nil
	}
	// Event i is due i intervals after the first: a late event (a busy machine) does not push
	// the following ones back, so turns started apart stay apart.
	var first time.Time
	i := 0
	replayed := agent.Replayed(ctx)
	for ev := range s.events {
		if i == 0 {
			first = time.Now()
		} else if i < replayed {
			first = time.Now().Add(-time.Duration(i) * interval) // a replay's stored part is not paced
		} else if interval > 0 {
			if wait := time.Until(first.Add(time.Duration(i) * interval)); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("demo: %w", ctx.Err())
				case <-timer.C:
				}
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
				bad := event{typ: "TEXT_MESSAGE_CONTENT", messageID: s.runID + ".never-started", delta: "x", hasDelta: true}
				if err := send(&bad); err != nil {
					return err
				}
			}
		}
		if err := send(&ev); err != nil {
			return err
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

// isoMillis is the layout of createdAt.
const isoMillis = "2006-01-02T15:04:05.000Z07:00"

// answer is the approval a continuation run answers.
type answer struct {
	parentRunID string
	callID      string // the call the approval was asked for
	approved    bool
}

// answerOf reads the first resume entry of a continuation run.
func answerOf(in *protocol.RunAgentInput) *answer {
	r := in.Resume[0]
	var p struct {
		Approved bool `json:"approved"`
	}
	json.Unmarshal(r.Payload, &p)
	return &answer{parentRunID: in.ParentRunID, callID: strings.TrimSuffix(r.InterruptID, approvalSuffix),
		approved: r.Status == "resolved" && p.Approved}
}

// approvalSuffix makes an approval's interrupt id from its tool call's id.
const approvalSuffix = ".approval"

// Texts of a continuation run, and the approved call's result.
const (
	approvedText = "Approved: it is 18 °C in Paris."
	declinedText = "Declined: I did not check the weather."
	toolResult   = `{"city":"Paris","unit":"celsius","temperature":18}`
)

// toolInput is the tool call's arguments, decoded (toolArgs joined).
var toolInput = strings.Join(toolArgs, "")

// script is the sequence of events of one turn, without the injected failure or violation.
type script struct {
	threadID, runID string
	opts            Options
	userText        string
	answer          *answer // the approval a continuation run answers; nil for another run
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

// deltas yields the reply's content events of message msg, generated lazily (tokens may be
// large): delta i of tokens is token i, encoded without building its string.
func (s *script) deltas(typ, msg string, yield func(event) bool) bool {
	if s.answer != nil {
		text := declinedText
		if s.answer.approved {
			text = approvedText
		}
		for _, d := range splitWords(text) {
			if !yield(event{typ: typ, messageID: msg, delta: d, hasDelta: true}) {
				return false
			}
		}
		return true
	}
	if s.opts.Tokens == nil {
		for _, d := range reply(s.userText) {
			if !yield(event{typ: typ, messageID: msg, delta: d, hasDelta: true}) {
				return false
			}
		}
		return true
	}
	for i := 1; i <= *s.opts.Tokens; i++ {
		if !yield(event{typ: typ, messageID: msg, token: i, hasDelta: true}) {
			return false
		}
	}
	return true
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
	started := event{typ: "RUN_STARTED", threadID: s.threadID, runID: s.runID}
	if s.answer != nil {
		started.parentRunID = s.answer.parentRunID
	}
	if !yield(started) {
		return false
	}
	msg := id("msg")
	if !s.opts.Chunked && !yield(event{typ: "TEXT_MESSAGE_START", messageID: msg, role: "assistant"}) {
		return false
	}
	if s.opts.Reasoning {
		span, thought := id("reasoning"), id("thought")
		if !yield(event{typ: "REASONING_START", messageID: span}) ||
			!yield(event{typ: "REASONING_MESSAGE_START", messageID: thought, role: "reasoning"}) {
			return false
		}
		for _, d := range splitWords(reasoningText) {
			if !yield(event{typ: "REASONING_MESSAGE_CONTENT", messageID: thought, delta: d, hasDelta: true}) {
				return false
			}
		}
		if !yield(event{typ: "REASONING_MESSAGE_END", messageID: thought}) ||
			!yield(event{typ: "REASONING_END", messageID: span}) {
			return false
		}
	}
	if s.opts.ToolCall && !s.toolCall(id("call"), yield) {
		return false
	}
	if a := s.answer; a != nil && a.approved && k == 1 &&
		!yield(event{typ: "TOOL_CALL_RESULT", messageID: id("result"), toolCallID: a.callID, content: toolResult, role: "tool"}) {
		return false
	}
	if s.opts.Chunked {
		// The first chunk carries the role; a reply without deltas is one chunk with the role.
		first := true
		ok := s.deltas("TEXT_MESSAGE_CHUNK", msg, func(ev event) bool {
			if first {
				ev.role, first = "assistant", false
			}
			return yield(ev)
		})
		if !ok || first && !yield(event{typ: "TEXT_MESSAGE_CHUNK", messageID: msg, role: "assistant"}) {
			return false
		}
	} else if !s.deltas("TEXT_MESSAGE_CONTENT", msg, yield) || !yield(event{typ: "TEXT_MESSAGE_END", messageID: msg}) {
		return false
	}
	finished := event{typ: "RUN_FINISHED", threadID: s.threadID, runID: s.runID}
	if s.opts.Usage {
		finished.usage = s.usage()
	}
	if s.opts.Approval && s.answer == nil && k == s.runs() {
		// The last run asks for approval of a tool call; the turn's earlier runs do not.
		call := id("approval-call")
		if !s.toolCall(call, yield) {
			return false
		}
		finished.outcome = approvalOutcome(call)
	}
	return yield(finished)
}

// usage is the TokenUsage array of a run's RUN_FINISHED: the words of the user's message in,
// the reply's deltas out.
func (s *script) usage() string {
	in := len(splitWords(s.userText))
	out := 0
	s.deltas("", "", func(event) bool { out++; return true })
	return fmt.Sprintf(`[{"model":"demo","inputTokens":%d,"outputTokens":%d,"totalTokens":%d}]`, in, out, in+out)
}

// toolCall yields a get_weather call with its arguments in several deltas.
func (s *script) toolCall(call string, yield func(event) bool) bool {
	if !yield(event{typ: "TOOL_CALL_START", toolCallID: call, toolCallName: ToolName}) {
		return false
	}
	for _, d := range toolArgs {
		if !yield(event{typ: "TOOL_CALL_ARGS", toolCallID: call, delta: d, hasDelta: true}) {
			return false
		}
	}
	return yield(event{typ: "TOOL_CALL_END", toolCallID: call})
}

// approvalOutcome is the interrupt outcome asking to approve call.
func approvalOutcome(call string) string {
	b, _ := json.Marshal(map[string]any{"type": "interrupt", "interrupts": []any{map[string]any{
		"id": call + approvalSuffix, "reason": "approval_required", "toolCallId": call,
		"metadata": map[string]any{"kind": "approval", "toolName": ToolName, "input": json.RawMessage(toolInput)},
	}}})
	return string(b)
}

// event is one AG-UI event the demo emits. appendJSON writes the fields in this order and
// leaves out the empty ones.
type event struct {
	typ, threadID, runID, parentRunID, messageID, role, toolCallID, toolCallName, content string

	outcome   string // RUN_FINISHED's outcome, JSON; "" for none
	usage     string // RUN_FINISHED's usage, JSON; "" for none
	createdAt string // TEXT_MESSAGE_START's metadata.tanstack.createdAt; "" for none

	hasDelta bool   // the event has a delta: delta, or "t<token> " when token > 0
	delta    string // the delta's text when token is 0
	token    int
}

// appendJSON appends the event as one JSON object, ending with "timestamp" and, but on a
// chunk, "metadata":{"emitMicros"} when at is not zero.
func (e *event) appendJSON(b []byte, at time.Time) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, e.typ)
	for _, f := range [...]struct{ key, val string }{
		{`,"threadId":`, e.threadID}, {`,"runId":`, e.runID}, {`,"parentRunId":`, e.parentRunID},
		{`,"messageId":`, e.messageID}, {`,"role":`, e.role}, {`,"toolCallId":`, e.toolCallID},
		{`,"toolCallName":`, e.toolCallName}, {`,"content":`, e.content},
	} {
		if f.val != "" {
			b = append(b, f.key...)
			b = appendString(b, f.val)
		}
	}
	switch {
	case e.hasDelta && e.token > 0:
		b = append(b, `,"delta":"t`...)
		b = strconv.AppendInt(b, int64(e.token), 10)
		b = append(b, ` "`...)
	case e.hasDelta:
		b = append(b, `,"delta":`...)
		b = appendString(b, e.delta)
	}
	if e.outcome != "" {
		b = append(b, `,"outcome":`...)
		b = append(b, e.outcome...)
	}
	if e.usage != "" {
		b = append(b, `,"usage":`...)
		b = append(b, e.usage...)
	}
	micros := !at.IsZero() && !strings.HasSuffix(e.typ, "_CHUNK")
	if !at.IsZero() {
		b = append(b, `,"timestamp":`...)
		b = strconv.AppendInt(b, at.UnixMilli(), 10)
	}
	if micros || e.createdAt != "" {
		b = append(b, `,"metadata":{`...)
		if e.createdAt != "" {
			b = append(b, `"tanstack":{"createdAt":`...)
			b = appendString(b, e.createdAt)
			b = append(b, '}')
			if micros {
				b = append(b, ',')
			}
		}
		if micros {
			b = append(b, `"emitMicros":`...)
			b = strconv.AppendInt(b, at.UnixMicro(), 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string exactly as encoding/json writes it (the bytes the
// demo has always emitted). Types and usual ids are plain ASCII and are copied as they are; a
// string that needs escaping (quotes, control characters, the HTML characters encoding/json
// escapes, anything beyond ASCII) goes to encoding/json: a word of a user's message, or an
// unusual id, never the token deltas the benchmarks stream.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
