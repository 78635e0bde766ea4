package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// input decodes a run frame for thread "th", run "r1", whose last user message is text, with
// forwardedProps.demo = demoOpts (JSON; empty for none).
func input(tb testing.TB, text, demoOpts string) *protocol.RunAgentInput {
	tb.Helper()
	props := ""
	if demoOpts != "" {
		props = `,"forwardedProps":{"demo":` + demoOpts + `}`
	}
	frame := `{"threadId":"th","runId":"r1","messages":[` +
		`{"id":"u0","role":"user","content":"earlier"},` +
		`{"id":"a0","role":"assistant","content":"reply"},` +
		`{"id":"u1","role":"user","content":` + quote(text) + `}]` + props + `}`
	in, err := protocol.DecodeRunAgentInput([]byte(frame))
	if err != nil {
		tb.Fatalf("DecodeRunAgentInput(%s): %v", frame, err)
	}
	return in
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// collect runs the agent and returns the events it emitted and its error.
func collect(tb testing.TB, in *protocol.RunAgentInput) ([]string, error) {
	tb.Helper()
	var got []string
	err := New().Run(context.Background(), in, func(ev []byte) error {
		got = append(got, string(ev))
		return nil
	})
	return got, err
}

// Event spellings used by the tables below.
const (
	runStarted  = `{"type":"RUN_STARTED","threadId":"th","runId":"r1"}`
	runFinished = `{"type":"RUN_FINISHED","threadId":"th","runId":"r1"}`
)

// textStart is the start of reply k emitted at the start of a synctest bubble (its clock reads
// 2000-01-01 midnight UTC) plus ms milliseconds.
func textStart(k int, ms ...int) string {
	at := 0
	if len(ms) > 0 {
		at = ms[0]
	}
	return fmt.Sprintf(`{"type":"TEXT_MESSAGE_START","messageId":"r1.msg%d","role":"assistant",`+
		`"metadata":{"tanstack":{"createdAt":"2000-01-01T00:00:00.%03dZ"}}}`, k, at)
}
func textContent(k int, d string) string {
	return fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.msg%d","delta":%q}`, k, d)
}
func textEnd(k int) string {
	return fmt.Sprintf(`{"type":"TEXT_MESSAGE_END","messageId":"r1.msg%d"}`, k)
}

func message(k int, deltas ...string) []string {
	return append([]string{textStart(k)}, replyOf(k, deltas...)...)
}

// replyOf is the content and end of reply k.
func replyOf(k int, deltas ...string) []string {
	var out []string
	for _, d := range deltas {
		out = append(out, textContent(k, d))
	}
	return append(out, textEnd(k))
}

func seq(parts ...any) []string {
	var out []string
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			out = append(out, p)
		case []string:
			out = append(out, p...)
		}
	}
	return out
}

var (
	reasoning1 = []string{
		`{"type":"REASONING_START","messageId":"r1.reasoning1"}`,
		`{"type":"REASONING_MESSAGE_START","messageId":"r1.thought1","role":"reasoning"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":"The"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" user"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" wants"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" a"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" reply;"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" I"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" will"}`,
		`{"type":"REASONING_MESSAGE_CONTENT","messageId":"r1.thought1","delta":" answer."}`,
		`{"type":"REASONING_MESSAGE_END","messageId":"r1.thought1"}`,
		`{"type":"REASONING_END","messageId":"r1.reasoning1"}`,
	}
	approvalCall = []string{
		`{"type":"TOOL_CALL_START","toolCallId":"r1.approval-call1","toolCallName":"get_weather"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.approval-call1","delta":"{\"city\":"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.approval-call1","delta":"\"Paris\","}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.approval-call1","delta":"\"unit\":\"celsius\""}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.approval-call1","delta":"}"}`,
		`{"type":"TOOL_CALL_END","toolCallId":"r1.approval-call1"}`,
	}
	approvalFinished = `{"type":"RUN_FINISHED","threadId":"th","runId":"r1","outcome":{"interrupts":[{"id":"r1.approval-call1.approval",` +
		`"metadata":{"input":{"city":"Paris","unit":"celsius"},"kind":"approval","toolName":"get_weather"},` +
		`"reason":"approval_required","toolCallId":"r1.approval-call1"}],"type":"interrupt"}}`
	toolCall1 = []string{
		`{"type":"TOOL_CALL_START","toolCallId":"r1.call1","toolCallName":"get_weather"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.call1","delta":"{\"city\":"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.call1","delta":"\"Paris\","}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.call1","delta":"\"unit\":\"celsius\""}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"r1.call1","delta":"}"}`,
		`{"type":"TOOL_CALL_END","toolCallId":"r1.call1"}`,
	}
)

func TestEvents(t *testing.T) {
	tests := []struct {
		name string
		text string
		opts string
		want []string
	}{
		{"default reply", "hello  wide\nworld", "",
			seq(runStarted, textStart(1, 20), replyOf(1, "You", " said:", " hello", "  wide", "\nworld"), runFinished)},
		{"empty user text", "", `{"intervalMs":0}`,
			seq(runStarted, message(1, "You", " said: "), runFinished)},
		{"tokens", "ignored", `{"tokens":3,"intervalMs":0}`,
			seq(runStarted, message(1, "t1 ", "t2 ", "t3 "), runFinished)},
		{"zero tokens", "ignored", `{"tokens":0,"intervalMs":0}`,
			seq(runStarted, message(1), runFinished)},
		{"chunked", "x", `{"tokens":2,"chunked":true,"intervalMs":0}`, seq(runStarted,
			`{"type":"TEXT_MESSAGE_CHUNK","messageId":"r1.msg1","role":"assistant","delta":"t1 "}`,
			`{"type":"TEXT_MESSAGE_CHUNK","messageId":"r1.msg1","delta":"t2 "}`,
			runFinished)},
		{"chunked, zero tokens", "x", `{"tokens":0,"chunked":true,"intervalMs":0}`, seq(runStarted,
			`{"type":"TEXT_MESSAGE_CHUNK","messageId":"r1.msg1","role":"assistant"}`,
			runFinished)},
		{"reasoning", "x", `{"tokens":1,"reasoning":true,"intervalMs":0}`,
			seq(runStarted, textStart(1), reasoning1, replyOf(1, "t1 "), runFinished)},
		{"tool call", "x", `{"tokens":1,"toolCall":true,"intervalMs":0}`,
			seq(runStarted, textStart(1), toolCall1, replyOf(1, "t1 "), runFinished)},
		{"reasoning and tool call", "x", `{"tokens":1,"toolCall":true,"reasoning":true,"intervalMs":0}`,
			seq(runStarted, textStart(1), reasoning1, toolCall1, replyOf(1, "t1 "), runFinished)},
		{"approval", "x", `{"tokens":1,"approval":true,"intervalMs":0}`,
			seq(runStarted, message(1, "t1 "), approvalCall, approvalFinished)},
		{"runs", "x", `{"tokens":1,"runs":3,"intervalMs":0}`, seq(
			runStarted, message(1, "t1 "), runFinished,
			runStarted, message(2, "t1 "), runFinished,
			runStarted, message(3, "t1 "), runFinished)},
		{"invalid", "x", `{"tokens":4,"invalid":true,"intervalMs":0}`, seq(
			runStarted, textStart(1), textContent(1, "t1 "), textContent(1, "t2 "),
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"r1.never-started","delta":"x"}`,
			textContent(1, "t3 "), textContent(1, "t4 "), textEnd(1), runFinished)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				got, err := collect(t, input(t, tt.text, tt.opts))
				if err != nil {
					t.Fatalf("Run error: %v", err)
				}
				if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
					t.Errorf("Run(%q, %s) emitted\n%s\nwant\n%s", tt.text, tt.opts, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
				}
			})
		})
	}
}

// TestApprovalAnswer: a continuation run whose resume answers the approval replies with the
// approved call's result, or declines.
func TestApprovalAnswer(t *testing.T) {
	for _, tt := range []struct {
		name, resume string
		want         []string
	}{
		{"approved", `{"interruptId":"r0.approval-call1.approval","status":"resolved","payload":{"approved":true}}`, seq(
			`{"type":"RUN_STARTED","threadId":"th","runId":"r1","parentRunId":"r0"}`, textStart(1),
			`{"type":"TOOL_CALL_RESULT","messageId":"r1.result1","role":"tool","toolCallId":"r0.approval-call1",`+
				`"content":"{\"city\":\"Paris\",\"unit\":\"celsius\",\"temperature\":18}"}`,
			replyOf(1, "Approved:", " it", " is", " 18", " °C", " in", " Paris."), runFinished)},
		{"declined", `{"interruptId":"r0.approval-call1.approval","status":"resolved","payload":{"approved":false}}`, seq(
			`{"type":"RUN_STARTED","threadId":"th","runId":"r1","parentRunId":"r0"}`, textStart(1),
			replyOf(1, "Declined:", " I", " did", " not", " check", " the", " weather."), runFinished)},
		{"cancelled", `{"interruptId":"r0.approval-call1.approval","status":"cancelled"}`, seq(
			`{"type":"RUN_STARTED","threadId":"th","runId":"r1","parentRunId":"r0"}`, textStart(1),
			replyOf(1, "Declined:", " I", " did", " not", " check", " the", " weather."), runFinished)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				in, err := protocol.DecodeRunAgentInput([]byte(`{"threadId":"th","runId":"r1","parentRunId":"r0","messages":[],` +
					`"resume":[` + tt.resume + `],"forwardedProps":{"demo":{"intervalMs":0,"approval":true}}}`))
				if err != nil {
					t.Fatal(err)
				}
				got, err := collect(t, in)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
					t.Errorf("emitted\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
				}
			})
		})
	}
}

// TestEventsPassTheVerifier runs every option through the gateway's protocol pipeline: the
// valid ones end terminated without a violation, and invalid is refused by the verifier.
func TestEventsPassTheVerifier(t *testing.T) {
	tests := []struct {
		opts      string
		violation bool
	}{
		{`{"intervalMs":0}`, false},
		{`{"tokens":5,"intervalMs":0}`, false},
		{`{"tokens":0,"intervalMs":0}`, false},
		{`{"tokens":5,"chunked":true,"intervalMs":0}`, false},
		{`{"tokens":0,"chunked":true,"intervalMs":0}`, false},
		{`{"tokens":3,"reasoning":true,"toolCall":true,"intervalMs":0}`, false},
		{`{"tokens":3,"reasoning":true,"toolCall":true,"chunked":true,"runs":3,"intervalMs":0}`, false},
		{`{"tokens":3,"invalid":true,"intervalMs":0}`, true},
		{`{"tokens":3,"runs":2,"invalid":true,"intervalMs":0}`, true},
		{`{"tokens":3,"reasoning":true,"toolCall":true,"runs":2,"timestamps":true,"intervalMs":0}`, false},
		{`{"tokens":3,"chunked":true,"timestamps":true,"intervalMs":0}`, false},
		{`{"tokens":3,"invalid":true,"timestamps":true,"intervalMs":0}`, true},
		{`{"tokens":3,"approval":true,"runs":2,"timestamps":true,"intervalMs":0}`, false},
		{`{"tokens":3,"approval":true,"toolCall":true,"reasoning":true,"intervalMs":0}`, false},
	}
	for _, tt := range tests {
		got, err := collect(t, input(t, "hi", tt.opts))
		if err != nil {
			t.Fatalf("Run(%s) error: %v", tt.opts, err)
		}
		p := protocol.NewPipeline(protocol.PipelineOptions{})
		var verr error
		var types []string
		for _, ev := range got {
			out, err := p.Push([]byte(ev))
			for _, e := range out {
				types = append(types, string(e.Type()))
			}
			if err != nil {
				verr = err
				break
			}
		}
		var violation *protocol.ViolationError
		switch {
		case tt.violation && !errors.As(verr, &violation):
			t.Errorf("pipeline on %s: error %v, want a *protocol.ViolationError", tt.opts, verr)
		case !tt.violation && verr != nil:
			t.Errorf("pipeline on %s: %v", tt.opts, verr)
		case !tt.violation && !p.Terminated():
			t.Errorf("pipeline on %s: not terminated after %s", tt.opts, types)
		}
		if strings.Contains(tt.opts, "chunked") && !tt.violation {
			joined := strings.Join(types, " ")
			if strings.Contains(joined, "CHUNK") || !strings.Contains(joined, "TEXT_MESSAGE_START") ||
				!strings.Contains(joined, "TEXT_MESSAGE_END RUN_FINISHED") {
				t.Errorf("chunked %s expanded to %s, want start/content/end before RUN_FINISHED", tt.opts, joined)
			}
		}
	}
}

// TestPauses checks the spacing of the events on the fake clock of a synctest bubble: the
// default reply is one word per content event, 20 ms apart, and intervalMs sets the pause.
func TestPauses(t *testing.T) {
	tests := []struct {
		opts string
		want time.Duration
	}{
		{"", 20 * time.Millisecond},
		{`{"intervalMs":7}`, 7 * time.Millisecond},
		{`{"intervalMs":0}`, 0},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var at []time.Duration
			err := New().Run(context.Background(), input(t, "a b", tt.opts), func([]byte) error {
				at = append(at, time.Since(start))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range at {
				if want := time.Duration(i) * tt.want; d != want {
					t.Errorf("opts %q: event %d emitted at %v, want %v", tt.opts, i, d, want)
				}
			}
		})
	}
}

// TestScheduleAfterLateEmit checks, on the fake clock, that an emit that takes longer than
// the interval does not push back the events after it: each is due at its place in the
// schedule set by the first event.
func TestScheduleAfterLateEmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Duration
		err := New().Run(context.Background(), input(t, "x", `{"tokens":4,"intervalMs":10}`), func([]byte) error {
			at = append(at, time.Since(start))
			if len(at) == 2 {
				time.Sleep(25 * time.Millisecond) // the second event's emit is slow
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		ms := time.Millisecond
		want := []time.Duration{0, 10 * ms, 35 * ms, 35 * ms, 40 * ms, 50 * ms, 60 * ms, 70 * ms}
		if !slices.Equal(at, want) {
			t.Errorf("events emitted at %v, want %v", at, want)
		}
	})
}

func TestCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		done := make(chan error)
		go func() {
			done <- New().Run(ctx, input(t, "x", `{"tokens":1000}`), func([]byte) error {
				n++
				return nil
			})
		}()
		time.Sleep(50 * time.Millisecond) // events at 0, 20, 40 ms
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run after cancel = %v, want context.Canceled", err)
			}
		default:
			t.Fatal("Run still running after its context was cancelled")
		}
		if n != 3 {
			t.Errorf("emitted %d events before the cancel at 50ms, want 3", n)
		}
	})
}

func TestEmitErrorStops(t *testing.T) {
	refused := errors.New("refused")
	n := 0
	err := New().Run(context.Background(), input(t, "x", `{"tokens":10,"intervalMs":0}`), func([]byte) error {
		n++
		if n == 3 {
			return refused
		}
		return nil
	})
	if !errors.Is(err, refused) || n != 3 {
		t.Errorf("Run with emit failing at event 3 = %v after %d events, want the emit error after 3", err, n)
	}
}

func TestFail(t *testing.T) {
	tests := []struct {
		opts string
		want []string
	}{
		{`{"fail":"start","intervalMs":0}`, nil},
		// Of 7 events (RUN_STARTED, TEXT_MESSAGE_START, 3 deltas, END, RUN_FINISHED) the agent
		// emits half, rounded down, then fails; of 8, 4.
		{`{"fail":"middle","tokens":3,"intervalMs":0}`, seq(runStarted, textStart(1), textContent(1, "t1 "))},
		{`{"fail":"middle","tokens":4,"intervalMs":0}`, seq(runStarted, textStart(1), textContent(1, "t1 "), textContent(1, "t2 "))},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			got, err := collect(t, input(t, "x", tt.opts))
			if !errors.Is(err, ErrInjected) {
				t.Errorf("Run(%s) error = %v, want ErrInjected", tt.opts, err)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("Run(%s) emitted\n%s\nwant\n%s", tt.opts, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestBadOptions(t *testing.T) {
	for _, opts := range []string{
		`{"tokens":-1}`,
		`{"tokens":1000001}`,
		`{"tokens":"5"}`,
		`{"tokens":1.5}`,
		`{"intervalMs":-1}`,
		`{"intervalMs":60001}`,
		`{"runs":0}`,
		`{"runs":101}`,
		`{"fail":"end"}`,
		`{"chunked":"yes"}`,
		`{"timestamps":1}`,
		`{"timestamps":"true"}`,
		`{"token":5}`,
		`[]`,
	} {
		got, err := collect(t, input(t, "x", opts))
		if !errors.Is(err, ErrOptions) || len(got) != 0 {
			t.Errorf("Run(%s) = %d events, %v; want no event and ErrOptions", opts, len(got), err)
		}
	}
}

func TestIgnoresOtherForwardedProps(t *testing.T) {
	in, err := protocol.DecodeRunAgentInput([]byte(`{"threadId":"th","runId":"r1","messages":[{"id":"u","role":"user","content":[{"type":"text","text":"from "},{"type":"text","text":"parts"}]}],"forwardedProps":{"model":"x"}}`))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		got, err := collect(t, in)
		if err != nil {
			t.Fatal(err)
		}
		want := seq(runStarted, textStart(1, 20), replyOf(1, "You", " said:", " from", " parts"), runFinished)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("emitted\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// TestTimestamps checks, on the fake clock of a synctest bubble, that with timestamps every
// event, the injected violation included, is the event without it plus "timestamp": the
// milliseconds since the epoch at its emit, and but on chunks "metadata":{"emitMicros"}.
func TestTimestamps(t *testing.T) {
	for _, opts := range []string{
		`{"tokens":3,"intervalMs":7%s}`,
		`{"tokens":2,"reasoning":true,"toolCall":true,"chunked":true,"runs":2,"intervalMs":3%s}`,
		`{"tokens":4,"invalid":true,"intervalMs":5%s}`,
	} {
		synctest.Test(t, func(t *testing.T) {
			plain, err := collect(t, input(t, "x", fmt.Sprintf(opts, "")))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var got []string
			var at []time.Time
			err = New().Run(context.Background(), input(t, "x", fmt.Sprintf(opts, `,"timestamps":true`)), func(ev []byte) error {
				got = append(got, string(ev))
				at = append(at, time.Now())
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(plain) || at[len(at)-1].Equal(start) {
				t.Fatalf("%s: %d events ending at %v, want %d spread over time", opts, len(got), at[len(at)-1], len(plain))
			}
			for i := range got {
				// A reply's start carries its createdAt in the metadata, beside emitMicros.
				base, createdAt, _ := strings.Cut(plain[i], `,"metadata":{"tanstack":{"createdAt":`)
				want := strings.TrimSuffix(base, "}") + `,"timestamp":` + strconv.FormatInt(at[i].UnixMilli(), 10)
				if createdAt != "" {
					want += `,"metadata":{"tanstack":{"createdAt":"` + at[i].UTC().Format("2006-01-02T15:04:05.000Z") + `"},` +
						`"emitMicros":` + strconv.FormatInt(at[i].UnixMicro(), 10) + "}"
				} else if !strings.Contains(plain[i], `_CHUNK"`) {
					want += `,"metadata":{"emitMicros":` + strconv.FormatInt(at[i].UnixMicro(), 10) + "}"
				}
				want += "}"
				if got[i] != want {
					t.Errorf("%s: event %d = %s, want %s", opts, i, got[i], want)
				}
			}
		})
	}
}

// legacyEvent is how events were encoded before appendJSON: encoding/json over this struct.
type legacyEvent struct {
	Type         string  `json:"type"`
	ThreadID     string  `json:"threadId,omitempty"`
	RunID        string  `json:"runId,omitempty"`
	MessageID    string  `json:"messageId,omitempty"`
	Role         string  `json:"role,omitempty"`
	ToolCallID   string  `json:"toolCallId,omitempty"`
	ToolCallName string  `json:"toolCallName,omitempty"`
	Delta        *string `json:"delta,omitempty"`
}

func legacyEncode(tb testing.TB, e *event) string {
	v := legacyEvent{Type: e.typ, ThreadID: e.threadID, RunID: e.runID, MessageID: e.messageID,
		Role: e.role, ToolCallID: e.toolCallID, ToolCallName: e.toolCallName}
	if e.hasDelta {
		d := e.delta
		if e.token > 0 {
			d = "t" + strconv.Itoa(e.token) + " "
		}
		v.Delta = &d
	}
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// TestEncodingUnchanged compares appendJSON with the encoding/json encoding it replaced on
// every event of several scripts, with user texts that need escaping: the bytes are the same.
func TestEncodingUnchanged(t *testing.T) {
	texts := []string{
		"hello  wide\nworld",
		`say "hi" \ back/slash`,
		"tab\tcr\rff\fbs\bnul\x00 unit\x1f del\x7f",
		"<b>tom & jerry</b>",
		"héllo wörld 日本語 emoji 🎉 combining é",
		"separators \u2028 and \u2029 here",
		"invalid \xff\xfe utf-8 and a lone \xed\xa0\x80 surrogate",
		"",
	}
	opts := []Options{
		{},
		{Tokens: ptr(12)},
		{Tokens: ptr(3), Chunked: true, Reasoning: true, ToolCall: true, Runs: ptr(2)},
		{Chunked: true},
		{Tokens: ptr(0), Chunked: true},
	}
	n := 0
	for _, text := range texts {
		for _, o := range opts {
			s := newScript(`th "1" <&>`, "r\u2028\\1", text, o)
			for ev := range s.events {
				got, want := string(ev.appendJSON(nil, time.Time{})), legacyEncode(t, &ev)
				if got != want {
					t.Errorf("text %q %+v: appendJSON = %s, encoding/json = %s", text, o, got, want)
				}
				n++
			}
		}
	}
	if n < 200 {
		t.Errorf("compared %d events, want a few hundred", n)
	}
}

func ptr(n int) *int { return &n }

// BenchmarkRun measures the agent's own cost per event (intervalMs 0, emit discarding), with
// the token deltas of the benchmarks and, for comparison, a reply of words that need escaping.
func BenchmarkRun(b *testing.B) {
	for _, bb := range []struct{ name, text, opts string }{
		{"tokens", "x", `{"tokens":10000,"intervalMs":0}`},
		{"tokens+timestamps", "x", `{"tokens":10000,"intervalMs":0,"timestamps":true}`},
		{"reply-escaped", strings.Repeat(`<héllo> "wörld" `, 500), `{"intervalMs":0}`},
	} {
		b.Run(bb.name, func(b *testing.B) {
			in := input(b, bb.text, bb.opts)
			a := New()
			events := 0
			run := func() {
				if err := a.Run(context.Background(), in, func([]byte) error { events++; return nil }); err != nil {
					b.Fatal(err)
				}
			}
			allocs := testing.AllocsPerRun(1, run) // also counts the events of one run
			perRun := events / 2
			b.ReportAllocs()
			for b.Loop() {
				run()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perRun), "ns/event")
			b.ReportMetric(allocs/float64(perRun), "allocs/event")
		})
	}
}
