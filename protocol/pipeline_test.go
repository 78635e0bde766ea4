package protocol

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func pushAll(tb testing.TB, p *Pipeline, events ...string) []string {
	tb.Helper()
	var out []string
	for _, e := range events {
		evs, err := p.Push([]byte(e))
		if err != nil {
			tb.Fatalf("Push(%s): %v", e, err)
		}
		for _, ev := range evs {
			out = append(out, string(ev.JSON()))
		}
	}
	return out
}

func TestPipelineFail(t *testing.T) {
	tests := []struct {
		name   string
		events []string
		want   []string
	}{
		{
			name:   "open chunk lanes are ended first",
			events: []string{`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`, `{"type":"TEXT_MESSAGE_CHUNK","messageId":"m1","delta":"a","subagentRunId":"s1"}`, `{"type":"TOOL_CALL_CHUNK","toolCallId":"c1","toolCallName":"f"}`},
			want:   []string{`{"type":"TEXT_MESSAGE_END","messageId":"m1","subagentRunId":"s1"}`, `{"type":"TOOL_CALL_END","toolCallId":"c1"}`, `{"type":"RUN_ERROR","message":"Request aborted","code":"aborted"}`},
		},
		{
			name:   "explicit messages are not ended",
			events: []string{`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`, `{"type":"TEXT_MESSAGE_START","messageId":"m1"}`},
			want:   []string{`{"type":"RUN_ERROR","message":"Request aborted","code":"aborted"}`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPipeline(PipelineOptions{})
			pushAll(t, p, tt.events...)
			if p.Terminated() {
				t.Fatal("Terminated() before Fail")
			}
			var got []string
			for _, e := range p.Fail("Request aborted", "aborted") {
				got = append(got, string(e.JSON()))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("Fail =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if !p.Terminated() {
				t.Fatal("Terminated() = false after Fail")
			}
			if _, err := p.Push([]byte(`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`)); !errors.Is(err, ErrPipelineFailed) {
				t.Fatalf("Push after Fail: %v, want ErrPipelineFailed", err)
			}
		})
	}
}

func TestPipelineErrorKeepsVerifiedPrefix(t *testing.T) {
	p := NewPipeline(PipelineOptions{})
	pushAll(t, p,
		`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`,
		`{"type":"STEP_STARTED","stepName":"s"}`,
		`{"type":"TEXT_MESSAGE_CHUNK","messageId":"m1","delta":"a"}`)
	evs, err := p.Push([]byte(`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`))
	var ve *ViolationError
	if !errors.As(err, &ve) || ve.Message != "Cannot send 'RUN_FINISHED' while steps are still active: s" {
		t.Fatalf("Push(RUN_FINISHED) error %v", err)
	}
	if len(evs) != 1 || string(evs[0].JSON()) != `{"type":"TEXT_MESSAGE_END","messageId":"m1"}` {
		t.Fatalf("Push(RUN_FINISHED) events %v, want the synthetic END only", evs)
	}
	if p.Terminated() {
		t.Fatal("Terminated() after a refused RUN_FINISHED")
	}
	if got := p.Fail("x", "protocol_violation"); len(got) != 1 || got[0].Type() != RunError {
		t.Fatalf("Fail after violation = %v, want the RUN_ERROR only", got)
	}
}

func TestPipelineTerminated(t *testing.T) {
	p := NewPipeline(PipelineOptions{})
	steps := []struct {
		event string
		term  bool
	}{
		{`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`, false},
		{`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`, true},
		{`{"type":"RUN_STARTED","threadId":"t","runId":"r2"}`, false},
		{`{"type":"RUN_ERROR","message":"boom"}`, true},
	}
	for _, s := range steps {
		pushAll(t, p, s.event)
		if p.Terminated() != s.term {
			t.Fatalf("after %s Terminated() = %v, want %v", s.event, p.Terminated(), s.term)
		}
	}
}

func TestUpgrade(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
		err  string
	}{
		{
			name: "nulls removed",
			in: []string{
				`{"type":"RUN_STARTED","threadId":"t","runId":"r","rawEvent":null,"input":{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":[{"type":"image","source":{"type":"url","value":"u"},"metadata":null}]}],"tools":[{"name":"f","description":"d","parameters":null}],"resume":[{"interruptId":"i","status":"resolved","payload":null}],"forwardedProps":null,"state":null}}`,
				`{"type":"TOOL_CALL_CHUNK","toolCallId":"c","toolCallName":"f","parentMessageId":null}`,
				`{"type":"RUN_FINISHED","threadId":"t","runId":"r","result":null,"outcome":null}`,
			},
			want: []string{
				`{"type":"RUN_STARTED","threadId":"t","runId":"r","input":{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":[{"type":"image","source":{"type":"url","value":"u"}}]}],"tools":[{"name":"f","description":"d"}],"resume":[{"interruptId":"i","status":"resolved"}],"context":[]}}`,
				`{"type":"TOOL_CALL_START","toolCallId":"c","toolCallName":"f"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"c"}`,
				`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`,
			},
		},
		{
			name: "binary parts",
			in: []string{
				`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`,
				`{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"u","role":"user","content":[{"type":"binary","mimeType":"audio/wav","data":"aGk="},{"type":"binary","mimeType":"image/png","url":"http://x","filename":"a.png"},{"type":"image","source":{"type":"url","value":"http://x","mimeType":"image/png"},"metadata":{"filename":"a.png"}}]}]}`,
			},
			want: []string{
				`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`,
				`{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"u","role":"user","content":[{"type":"audio","source":{"type":"data","value":"aGk=","mimeType":"audio/wav"}},{"type":"image","source":{"type":"url","value":"http://x","mimeType":"image/png"},"metadata":{"filename":"a.png"}}]}]}`,
			},
		},
		{
			name: "null message",
			in:   []string{`{"type":"MESSAGES_SNAPSHOT","messages":[null]}`},
			err:  "Cannot read properties of null (reading 'content')",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPipeline(PipelineOptions{Upgrade: true})
			var got []string
			var err error
			for _, e := range tt.in {
				var evs []*Event
				evs, err = p.Push([]byte(e))
				for _, ev := range evs {
					got = append(got, string(ev.JSON()))
				}
				if err != nil {
					break
				}
			}
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestDecodeEventKeepsBytes(t *testing.T) {
	in := " {\"type\" : \"TEXT_MESSAGE_CONTENT\",\n \"messageId\":\"m\\u00e9\", \"delta\":\"a \\\"b\\\"\\n\", \"x\":{\"deep\":[1, 2.50, {\"k\":null}]} }\n"
	e, err := DecodeEvent([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m\u00e9","delta":"a \"b\"\n","x":{"deep":[1,2.50,{"k":null}]}}`
	if string(e.JSON()) != want {
		t.Fatalf("JSON() = %s, want %s", e.JSON(), want)
	}
	if e.Type() != TextMessageContent || e.Str("messageId") != "mé" {
		t.Fatalf("Type() = %q, Str(messageId) = %q", e.Type(), e.Str("messageId"))
	}
}

func TestVerifyStream(t *testing.T) {
	in := "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n\n  \n{\"type\":\"TEXT_MESSAGE_END\",\"messageId\":\"m\"}\n"
	var out bytes.Buffer
	err := VerifyStream(strings.NewReader(in), &out, PipelineOptions{})
	var le *LineError
	if !errors.As(err, &le) || le.Line != 4 {
		t.Fatalf("VerifyStream error %v, want a LineError at line 4", err)
	}
	if want := "Cannot send 'TEXT_MESSAGE_END' event: No active text message found with ID 'm'. A 'TEXT_MESSAGE_START' event must be sent first."; le.Err.Error() != want {
		t.Fatalf("LineError.Err = %q, want %q", le.Err, want)
	}
	if out.String() != "{\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n" {
		t.Fatalf("output %q", out.String())
	}
}

func TestJSNumber(t *testing.T) {
	tests := map[string]string{
		"1.5e-7": "1.5e-7", "1e21": "1e+21", "-0": "0", "123": "123", "1e20": "100000000000000000000",
		"0.000001": "0.000001", "1.25": "1.25", "-2.5e-10": "-2.5e-10", "123456789012345678901234": "1.2345678901234569e+23",
		"1e400": "Infinity", "0.1": "0.1", "12.0": "12",
	}
	for in, want := range tests {
		if got := jsText([]byte(in)); got != want {
			t.Errorf("jsText(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestUnquoteKeepsLoneSurrogates(t *testing.T) {
	tests := []struct{ in, want string }{
		{`"a\"b\\c\/d\n"`, "a\"b\\c/d\n"},
		{`"\u00e9\ud83d\ude00"`, "é😀"},
		{`"\ud800"`, "\xed\xa0\x80"},
		{`"\ufffd"`, "\ufffd"},
		{`"\udc00x"`, "\xed\xb0\x80x"},
	}
	for _, tt := range tests {
		if got := unquote([]byte(tt.in)); got != tt.want {
			t.Errorf("unquote(%s) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// Two ids that differ in JavaScript are two messages here too.
	p := NewPipeline(PipelineOptions{})
	pushAll(t, p,
		`{"type":"RUN_STARTED","threadId":"t","runId":"r"}`,
		`{"type":"TEXT_MESSAGE_START","messageId":"\ud800"}`,
		`{"type":"TEXT_MESSAGE_START","messageId":"\ufffd"}`)
}

func TestAppendStringSurrogates(t *testing.T) {
	for _, in := range []string{`"\ud800"`, `"a\udfffb"`, `"\udc00\ud800"`, `"\ud83d\ude00"`, `"\u00e9"`} {
		got := string(appendString(nil, unquote([]byte(in))))
		want := in
		if in == `"\ud83d\ude00"` {
			want = `"😀"`
		}
		if in == `"\u00e9"` {
			want = `"é"`
		}
		if got != want {
			t.Errorf("appendString(unquote(%s)) = %s, want %s", in, got, want)
		}
	}
	if got := string(AppendRunError(nil, "id '"+unquote([]byte(`"\ud800"`))+"'", "")); got != `{"type":"RUN_ERROR","message":"id '\ud800'"}` {
		t.Errorf("AppendRunError = %s", got)
	}
}
