package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// seedEvents returns every event of the conformance vectors.
func seedEvents(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, v := range loadAGVectors(tb) {
		for _, e := range v.Events {
			out = append(out, e)
		}
	}
	return out
}

func FuzzDecodeEvent(f *testing.F) {
	for _, e := range seedEvents(f) {
		f.Add(e)
	}
	f.Add([]byte(` { "type" : "TEXT_MESSAGE_CONTENT", "messageId":"m\u00e9","delta":"a\nb", "x":[1, 2.5e3, {"y":null}] } `))
	f.Add([]byte(`{"type":"RUN_STARTED","threadId":"t","runId":"r","input":{"threadId":"t","runId":"r","messages":[],"tools":[],"state":null}}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"type":"CUSTOM","name":"c","value":1,"value":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeEvent(data)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) && !errors.Is(err, ErrNotJSON) {
				t.Fatalf("DecodeEvent(%q) error %T %v", data, err, err)
			}
			return
		}
		if !e.Type().Valid() {
			t.Fatalf("DecodeEvent(%q) accepted type %q", data, e.Type())
		}
		again, err := DecodeEvent(e.JSON())
		if err != nil {
			t.Fatalf("re-decode of %s: %v", e.JSON(), err)
		}
		if !bytes.Equal(again.JSON(), e.JSON()) {
			t.Fatalf("re-encode %s, then %s", e.JSON(), again.JSON())
		}
		if e.Type() != RunStarted {
			var in, out any
			if json.Unmarshal(data, &in) != nil || json.Unmarshal(e.JSON(), &out) != nil || !reflect.DeepEqual(in, out) {
				t.Fatalf("DecodeEvent(%q) = %s, not the same value", data, e.JSON())
			}
		}
	})
}

func FuzzPipeline(f *testing.F) {
	for _, v := range loadAGVectors(f) {
		if v.Section == "Schema" {
			continue
		}
		var b bytes.Buffer
		if v.Upgrade {
			b.WriteString("U\n")
		}
		for _, e := range v.Events {
			b.Write(e)
			b.WriteByte('\n')
		}
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := bytes.Split(data, []byte("\n"))
		opts := PipelineOptions{}
		if len(lines) > 0 && string(lines[0]) == "U" {
			opts.Upgrade, lines = true, lines[1:]
		}
		p := NewPipeline(opts)
		for _, line := range lines {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			events, err := p.Push(line)
			for _, e := range events {
				d, derr := DecodeEvent(e.JSON())
				if derr != nil {
					t.Fatalf("expanded event %s fails the schema: %v", e.JSON(), derr)
				}
				if !bytes.Equal(d.JSON(), e.JSON()) {
					t.Fatalf("expanded event %s re-decodes as %s", e.JSON(), d.JSON())
				}
			}
			if err != nil {
				var se *SchemaError
				var ve *ViolationError
				if !errors.As(err, &se) && !errors.As(err, &ve) && !errors.Is(err, ErrNotJSON) {
					t.Fatalf("Push(%q): error %T %v", line, err, err)
				}
				if _, err := p.Push(line); !errors.Is(err, ErrPipelineFailed) {
					t.Fatalf("Push after failure: %v, want ErrPipelineFailed", err)
				}
				break
			}
		}
		end := p.Fail("stopped", "aborted")
		if len(end) == 0 || end[len(end)-1].Type() != RunError || !p.Terminated() {
			t.Fatalf("Fail = %v, want events ending in RUN_ERROR", end)
		}
	})
}

func FuzzDecodeRunAgentInput(f *testing.F) {
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[{"id":"1","role":"tool","toolCallId":"c","content":"x"}],"tools":[{"name":"f","description":"d","parameters":{}}],"context":[{"description":"d","value":"v"}],"state":null,"forwardedProps":{"demo":"x"},"resume":[{"interruptId":"i","status":"resolved","payload":1}],"extra":true}`))
	f.Add([]byte(`{"threadId":"","runId":"r","messages":[]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodeRunAgentInput(data)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) && !errors.Is(err, ErrNotJSON) {
				t.Fatalf("DecodeRunAgentInput(%q): error %T %v", data, err, err)
			}
			return
		}
		if in.ThreadID == "" || in.RunID == "" || in.Tools == nil || in.Context == nil {
			t.Fatalf("DecodeRunAgentInput(%q) = %+v", data, in)
		}
		again, err := DecodeRunAgentInput(in.JSON())
		if err != nil {
			t.Fatalf("re-decode %s: %v", in.JSON(), err)
		}
		if !bytes.Equal(again.JSON(), in.JSON()) {
			t.Fatalf("re-encode %s, then %s", in.JSON(), again.JSON())
		}
	})
}

func FuzzDecodeClientFrame(f *testing.F) {
	f.Add([]byte(`{"type":"abort","runId":"run-1"}`))
	f.Add([]byte(`{"type":"abort"}`))
	f.Add([]byte(`{"type":"auth","token":"a.b.c"}`))
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeClientFrame(data)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) && !errors.Is(err, ErrNotJSON) {
				t.Fatalf("DecodeClientFrame(%q): error %T %v", data, err, err)
			}
			if errors.As(err, &ie) && strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("DecodeClientFrame(%q): empty message", data)
			}
			return
		}
		switch fr.Kind {
		case FrameAbort:
			if fr.Input != nil {
				t.Fatalf("abort frame with input: %+v", fr)
			}
		case FrameRun:
			if fr.Input == nil || fr.RunID != fr.Input.RunID || fr.RunID == "" {
				t.Fatalf("run frame %+v", fr)
			}
		case FrameAuth:
			if fr.Input != nil || fr.Token == "" {
				t.Fatalf("auth frame %+v", fr)
			}
		case FrameFollow, FrameUnfollow:
			if fr.Input != nil || fr.ThreadID == "" {
				t.Fatalf("follow frame %+v", fr)
			}
		default:
			t.Fatalf("DecodeClientFrame(%q) kind %d", data, fr.Kind)
		}
	})
}

func FuzzDecodeServerFrame(f *testing.F) {
	f.Add(AppendEnvelope(nil, "1-42", []byte(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x"}`)))
	f.Add(AppendRunError(nil, "boom", "invalid_input"))
	f.Add(PingFrame)
	f.Add([]byte(`{"id":"","chunk":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeServerFrame(data)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrNotJSON) {
				t.Fatalf("DecodeServerFrame(%q): error %T %v", data, err, err)
			}
			return
		}
		switch fr.Kind {
		case FramePing:
		case FrameEvent:
			if fr.Type == "" {
				t.Fatalf("bare event without type: %q", data)
			}
		case FrameEnvelope:
			again, err := DecodeServerFrame(AppendEnvelope(nil, fr.Offset, fr.Event))
			if err != nil || again.Offset != fr.Offset || !bytes.Equal(again.Event, fr.Event) || again.Type != fr.Type {
				t.Fatalf("envelope round trip of %q: %+v, %v", data, again, err)
			}
		default:
			t.Fatalf("kind %d", fr.Kind)
		}
	})
}
