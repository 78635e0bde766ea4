package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeClientFrame(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		kind    FrameKind
		runID   string
		token   string
		thread  string
		wantErr string // exact error text; "" for success
		notJSON bool
	}{
		{name: "abort", in: `{"type":"abort","runId":"run-1724320000000-k3j9x2"}`, kind: FrameAbort, runID: "run-1724320000000-k3j9x2"},
		{name: "run", in: `{"threadId":"t","runId":"r","messages":[{"id":"u1","role":"user","content":"hi"}],"extra":1}`, kind: FrameRun, runID: "r"},
		{name: "abort without runId is a run frame", in: `{"type":"abort"}`, wantErr: "threadId: required non-empty string"},
		{name: "auth", in: `{"type":"auth","token":"aaa.bbb.ccc"}`, kind: FrameAuth, token: "aaa.bbb.ccc"},
		{name: "auth without token", in: `{"type":"auth"}`, wantErr: "token: required non-empty string in an auth frame"},
		{name: "auth with an empty token", in: `{"type":"auth","token":""}`, wantErr: "token: required non-empty string in an auth frame"},
		{name: "auth with a token not a string", in: `{"type":"auth","token":1}`, wantErr: "token: required non-empty string in an auth frame"},
		{name: "follow", in: `{"type":"follow","threadId":"t-1"}`, kind: FrameFollow, thread: "t-1"},
		{name: "unfollow", in: `{"type":"unfollow","threadId":"t-1"}`, kind: FrameUnfollow, thread: "t-1"},
		{name: "follow without threadId", in: `{"type":"follow"}`, wantErr: "threadId: required non-empty string in a follow frame"},
		{name: "unfollow with an empty threadId", in: `{"type":"unfollow","threadId":""}`, wantErr: "threadId: required non-empty string in an unfollow frame"},
		{name: "not JSON", in: `{"threadId":`, notJSON: true},
		{name: "not an object", in: `[1]`, wantErr: "run input must be a JSON object, not array"},
		{name: "empty threadId", in: `{"threadId":"","runId":"r","messages":[]}`, wantErr: "threadId: required non-empty string"},
		{name: "runId not a string", in: `{"threadId":"t","runId":1,"messages":[]}`, wantErr: "runId: required non-empty string"},
		{name: "runId with a NUL", in: `{"threadId":"t","runId":"r\u0000","messages":[]}`, wantErr: "runId: must be printable UTF-8 of at most 512 bytes"},
		{name: "runId with CR LF", in: `{"threadId":"t","runId":"r\r\n","messages":[]}`, wantErr: "runId: must be printable UTF-8 of at most 512 bytes"},
		{name: "runId of 513 bytes", in: `{"threadId":"t","runId":"` + strings.Repeat("r", 513) + `","messages":[]}`, wantErr: "runId: must be printable UTF-8 of at most 512 bytes"},
		{name: "runId of 512 bytes", in: `{"threadId":"t","runId":"` + strings.Repeat("r", 512) + `","messages":[]}`, kind: FrameRun, runID: strings.Repeat("r", 512)},
		{name: "messages missing", in: `{"threadId":"t","runId":"r"}`, wantErr: "messages: required array"},
		{name: "bad role", in: `{"threadId":"t","runId":"r","messages":[{"id":"a","role":"user","content":"x"},{"id":"b","role":"user","content":"x"},{"id":"c","role":"robot"}]}`, wantErr: "messages[2].role: must be one of developer, system, assistant, user, tool, activity, reasoning"},
		{name: "message id", in: `{"threadId":"t","runId":"r","messages":[{"role":"user","content":"x"}]}`, wantErr: "messages[0].id: required string"},
		{name: "tool message without toolCallId", in: `{"threadId":"t","runId":"r","messages":[{"id":"a","role":"tool","content":"x"}]}`, wantErr: "messages[0].toolCallId: required string for a tool message"},
		{name: "tool message content", in: `{"threadId":"t","runId":"r","messages":[{"id":"a","role":"tool","toolCallId":"c","content":[]}]}`, wantErr: "messages[0].content: must be a string for a tool message"},
		{name: "tool description", in: `{"threadId":"t","runId":"r","messages":[],"tools":[{"name":"f"}]}`, wantErr: "tools[0].description: required string"},
		{name: "context value", in: `{"threadId":"t","runId":"r","messages":[],"context":[{"description":"d","value":3}]}`, wantErr: "context[0].value: required string"},
		{name: "resume status", in: `{"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"i","status":"later"}]}`, wantErr: `resume[0].status: must be "resolved" or "cancelled"`},
		{name: "forwardedProps", in: `{"threadId":"t","runId":"r","messages":[],"forwardedProps":[]}`, wantErr: "forwardedProps: must be an object"},
		{name: "multitaskStrategy", in: `{"threadId":"t","runId":"r","messages":[],"multitaskStrategy":"reject"}`, kind: FrameRun, runID: "r"},
		{name: "multitaskStrategy unknown", in: `{"threadId":"t","runId":"r","messages":[],"multitaskStrategy":"later"}`, wantErr: "multitaskStrategy: must be one of enqueue, reject, interrupt, rollback, concurrent"},
		{name: "multitaskStrategy not a string", in: `{"threadId":"t","runId":"r","messages":[],"multitaskStrategy":1}`, wantErr: "multitaskStrategy: must be one of enqueue, reject, interrupt, rollback, concurrent"},
		{name: "state null is absent", in: `{"threadId":"t","runId":"r","messages":[],"state":null,"forwardedProps":null}`, kind: FrameRun, runID: "r"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr, err := DecodeClientFrame([]byte(tt.in))
			switch {
			case tt.notJSON:
				if !errors.Is(err, ErrNotJSON) {
					t.Fatalf("DecodeClientFrame(%s) = %v, want ErrNotJSON", tt.in, err)
				}
			case tt.wantErr != "":
				var ie *InputError
				if !errors.As(err, &ie) || err.Error() != tt.wantErr || !errors.Is(err, ErrInvalidInput) {
					t.Fatalf("DecodeClientFrame(%s) = %v, want %q", tt.in, err, tt.wantErr)
				}
			default:
				if err != nil || fr.Kind != tt.kind || fr.RunID != tt.runID || fr.Token != tt.token || fr.ThreadID != tt.thread {
					t.Fatalf("DecodeClientFrame(%s) = %+v, %v; want kind %d runId %q", tt.in, fr, err, tt.kind, tt.runID)
				}
			}
		})
	}
}

func TestRunAgentInput(t *testing.T) {
	in, err := DecodeRunAgentInput([]byte(`{
		"threadId":"t","runId":"r","state":null,"forwardedProps":{"demo":"tools"},"custom":{"k":1},
		"messages":[
			{"id":"u1","role":"user","content":"first"},
			{"id":"a1","role":"assistant","content":null,"toolCalls":[]},
			{"id":"u2","role":"user","content":[{"type":"text","text":"hello "},{"type":"image","source":{"type":"url","value":"https://example.com/x.png"}},{"type":"text","text":"world"}]},
			{"id":"t1","role":"tool","toolCallId":"c1","content":"42"}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := in.LastUserText(); got != "hello world" {
		t.Errorf("LastUserText() = %q, want %q", got, "hello world")
	}
	if got := string(in.ForwardedProp("demo")); got != `"tools"` {
		t.Errorf(`ForwardedProp("demo") = %s, want "tools"`, got)
	}
	if in.State != nil || len(in.Tools) != 0 || in.Tools == nil || in.Context == nil || len(in.Messages) != 4 || in.Messages[3].ToolCallID != "c1" {
		t.Errorf("decoded %+v", in)
	}
	want := `{"threadId":"t","runId":"r","forwardedProps":{"demo":"tools"},"custom":{"k":1},"messages":[{"id":"u1","role":"user","content":"first"},{"id":"a1","role":"assistant","content":null,"toolCalls":[]},{"id":"u2","role":"user","content":[{"type":"text","text":"hello "},{"type":"image","source":{"type":"url","value":"https://example.com/x.png"}},{"type":"text","text":"world"}]},{"id":"t1","role":"tool","toolCallId":"c1","content":"42"}],"tools":[],"context":[]}`
	if got := string(in.JSON()); got != want {
		t.Errorf("JSON() =\n%s\nwant\n%s", got, want)
	}
}

func TestServerFrames(t *testing.T) {
	ev := []byte(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x"}`)
	env := AppendEnvelope(nil, "1-7", ev)
	if want := `{"id":"1-7","chunk":{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x"}}`; string(env) != want {
		t.Fatalf("AppendEnvelope = %s, want %s", env, want)
	}
	if got, want := string(AppendRunEnvelope(nil, "1-7", ev, `r"1`)), `{"id":"1-7","chunk":{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x"},"runId":"r\"1"}`; got != want {
		t.Fatalf("AppendRunEnvelope = %s, want %s", got, want)
	}
	if fr, err := DecodeServerFrame(AppendRunEnvelope(nil, "1-7", ev, "r")); err != nil || fr.Kind != FrameEnvelope || fr.Offset != "1-7" || string(fr.Event) != string(ev) {
		t.Fatalf("DecodeServerFrame(AppendRunEnvelope) = %+v, %v", fr, err)
	}
	tests := []struct {
		in     string
		kind   FrameKind
		offset string
		event  string
		typ    EventType
		bad    bool
	}{
		{in: string(env), kind: FrameEnvelope, offset: "1-7", event: string(ev), typ: TextMessageContent},
		{in: string(AppendRunError(nil, "bad \"input\"", "invalid_input")), kind: FrameEvent, event: `{"type":"RUN_ERROR","message":"bad \"input\"","code":"invalid_input"}`, typ: RunError},
		{in: string(PingFrame), kind: FramePing},
		{in: `{"id":"1","chunk":"x"}`, bad: true},
		{in: `{"chunk":{"type":"RAW"}}`, bad: true},
		{in: `{"type":""}`, bad: true},
		{in: `[]`, bad: true},
	}
	for _, tt := range tests {
		fr, err := DecodeServerFrame([]byte(tt.in))
		if tt.bad {
			if !errors.Is(err, ErrBadFrame) {
				t.Errorf("DecodeServerFrame(%s) = %+v, %v, want ErrBadFrame", tt.in, fr, err)
			}
			continue
		}
		if err != nil || fr.Kind != tt.kind || fr.Offset != tt.offset || string(fr.Event) != tt.event || fr.Type != tt.typ {
			t.Errorf("DecodeServerFrame(%s) = %+v (%s), %v", tt.in, fr, fr.Event, err)
		}
	}
	if got := string(AppendRunError(nil, "Request aborted", "")); got != `{"type":"RUN_ERROR","message":"Request aborted"}` {
		t.Errorf("AppendRunError without code = %s", got)
	}
	if got := RunAccepted(); got.Type() != Custom || string(got.JSON()) != `{"type":"CUSTOM","name":"run.accepted","value":{}}` || got.Str("name") != RunAcceptedName {
		t.Errorf("RunAccepted() = %s", got.JSON())
	}
}

// TestRunQueued: the run.queued event is a CUSTOM named RunQueuedName with the runs ahead,
// and IsRunQueued tells it from the marker.
func TestRunQueued(t *testing.T) {
	got := RunQueued(3)
	if got.Type() != Custom || string(got.JSON()) != `{"type":"CUSTOM","name":"run.queued","value":{"ahead":3}}` || got.Str("name") != RunQueuedName {
		t.Errorf("RunQueued(3) = %s", got.JSON())
	}
	if !IsRunQueued(got.JSON()) || IsRunQueued(RunAccepted().JSON()) {
		t.Errorf("IsRunQueued: run.queued %v, run.accepted %v; want true, false", IsRunQueued(got.JSON()), IsRunQueued(RunAccepted().JSON()))
	}
}
