package conversation

import (
	"errors"
	"strings"
	"testing"
)

// TestNewContinueLog: what a takeover that continues a reply (Config.Continue) makes of the
// stored events: the assistant message that gives the agent the reply so far, the offsets its
// own start of the run and of that message are answered with, and a refusal of anything but
// one text reply.
func TestNewContinueLog(t *testing.T) {
	entries := func(events ...string) []Entry {
		out := make([]Entry, len(events))
		for i, e := range events {
			out[i] = Entry{Offset: string(rune('a' + i)), Event: []byte(e)}
		}
		return out
	}
	const (
		accepted = `{"type":"CUSTOM","name":"run.accepted","value":{}}`
		started  = `{"type":"RUN_STARTED","threadId":"t","runId":"r"}`
		start    = `{"type":"TEXT_MESSAGE_START","messageId":"r.msg1","role":"assistant"}`
		end      = `{"type":"TEXT_MESSAGE_END","messageId":"r.msg1"}`
	)
	content := func(d string) string {
		return `{"type":"TEXT_MESSAGE_CONTENT","messageId":"r.msg1","delta":"` + d + `"}`
	}
	for _, tt := range []struct {
		name    string
		stored  []Entry
		reply   string // the assistant message's JSON ("" for none)
		ended   bool
		refused bool
	}{
		{"accepted only", entries(accepted), "", false, false},
		{"started", entries(accepted, started), "", false, false},
		{"a message in progress", entries(accepted, started, start, content("Hel"), content("lo")), `{"content":"Hello","id":"r.msg1","role":"assistant"}`, false, false},
		{"a message ended", entries(accepted, started, start, content("Hi"), end), `{"content":"Hi","id":"r.msg1","role":"assistant"}`, true, false},
		{"a tool call", entries(accepted, started, `{"type":"TOOL_CALL_START","toolCallId":"c","toolCallName":"f"}`), "", false, true},
		{"a second message", entries(accepted, started, start, end, strings.Replace(start, "msg1", "msg2", 1)), "", false, true},
		{"content of another message", entries(accepted, started, start, strings.Replace(content("x"), "msg1", "msg9", 1)), "", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, reply, err := newContinueLog(nil, tt.stored)
			if tt.refused {
				if !errors.Is(err, errNotContinuable) {
					t.Fatalf("newContinueLog = %v, want errNotContinuable", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.reply == "" && reply != nil:
				t.Errorf("reply %s, want none", reply.Raw)
			case tt.reply != "" && (reply == nil || string(reply.Raw) != tt.reply || reply.Role != "assistant"):
				t.Errorf("reply %+v, want %s", reply, tt.reply)
			}
			if l.ended != tt.ended {
				t.Errorf("ended = %v, want %v", l.ended, tt.ended)
			}
			if len(tt.stored) > 1 && l.started != "b" {
				t.Errorf("RUN_STARTED answered with offset %q, want the stored one, b", l.started)
			}
			if tt.reply != "" && l.msgStart != "c" {
				t.Errorf("TEXT_MESSAGE_START answered with offset %q, want the stored one, c", l.msgStart)
			}
		})
	}
}
