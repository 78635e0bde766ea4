package thread_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// reply is a run's events answering with one assistant message.
func reply(runID, msgID, text string) []json.RawMessage {
	return run(runID, nil, startedRun(runID),
		`{"type":"TEXT_MESSAGE_START","messageId":"`+msgID+`","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"`+msgID+`","delta":"`+text+`"}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"`+msgID+`"}`, finishedRun(runID)).Events
}

func summaryOf(msgs []thread.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.ID + ":")
		for _, p := range m.Parts {
			b.WriteString(p.Content)
		}
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

// TestFinishAfterNextAccept: a reply whose finish lands after the next run's acceptance (a
// client that sends the next message as soon as it has the reply's terminal) is placed right
// after its own question, not after the next one; a copy of it that the next run posted with
// the id the gateway gave it is kept once, as built.
func TestFinishAfterNextAccept(t *testing.T) {
	for _, tc := range []struct {
		name string
		r2   json.RawMessage
	}{
		{"only the new message", input(t, "r2", "", `{"id":"u2","role":"user","content":"two"}`)},
		{"the whole transcript", input(t, "r2", "", `{"id":"u1","role":"user","content":"one"}`,
			`{"id":"a1","role":"assistant","content":"reply one"}`, `{"id":"u2","role":"user","content":"two"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr thread.Transcript
			if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"one"}`)); err != nil {
				t.Fatal(err)
			}
			tr = copyTranscript(t, tr)
			if err := tr.Accept("r2", tc.r2); err != nil {
				t.Fatal(err)
			}
			tr = copyTranscript(t, tr)
			if err := tr.Finish("r1", reply("r1", "a1", "reply one")); err != nil {
				t.Fatal(err)
			}
			if got, want := summaryOf(tr.Messages), "u1:one a1:reply one u2:two"; got != want {
				t.Fatalf("after r1's finish: %s, want %s", got, want)
			}
			tr = copyTranscript(t, tr)
			if err := tr.Finish("r2", reply("r2", "a2", "reply two")); err != nil {
				t.Fatal(err)
			}
			if got, want := summaryOf(tr.Messages), "u1:one a1:reply one u2:two a2:reply two"; got != want {
				t.Fatalf("after r2's finish: %s, want %s", got, want)
			}
			if tr.Anchors != nil {
				t.Fatalf("Anchors = %v after every run finished, want none", tr.Anchors)
			}
		})
	}
}

// TestAnswerBeforeFinishLands: an approval's answer, and a client tool's result, accepted
// before the finish of the run that made the call landed, answer the call once it does.
func TestAnswerBeforeFinishLands(t *testing.T) {
	var tr thread.Transcript
	if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"weather?"}`)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Accept("r2", input(t, "r2", `[{"interruptId":"i1","status":"resolved","payload":{"approved":true}}]`)); err != nil {
		t.Fatal(err)
	}
	tr = copyTranscript(t, tr)
	if err := tr.Finish("r1", approvalRun().Events); err != nil {
		t.Fatal(err)
	}
	if p := tr.Messages[1].Parts[1]; p.State != "approval-responded" || p.Approval == nil || p.Approval.Approved == nil || !*p.Approval.Approved {
		t.Fatalf("the call after r1's finish = %s, want approval-responded, approved", mustJSON(t, p))
	}
	if tr.Interrupts != nil || tr.Late != nil {
		t.Fatalf("Interrupts = %s, Late = %s: want none, r2 answered them", mustJSON(t, tr.Interrupts), mustJSON(t, tr.Late))
	}
	if err := tr.Finish("r2", answerRun(true).Events); err != nil {
		t.Fatal(err)
	}
	if got, want := summaryOf(tr.Messages), "u1:weather? m1:Let me check.{\"temp\":20} m2:It is 20 degrees."; got != want {
		t.Fatalf("after r2: %s, want %s", got, want)
	}

	// A client tool: the call without approval, its result posted alone by the next run.
	var ct thread.Transcript
	if err := ct.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"weather?"}`)); err != nil {
		t.Fatal(err)
	}
	if err := ct.Accept("r2", input(t, "r2", "", `{"id":"tool-c1","role":"tool","toolCallId":"c1","content":"{\"temp\":18}"}`)); err != nil {
		t.Fatal(err)
	}
	ct = copyTranscript(t, ct)
	call := run("r1", nil, startedRun("r1"),
		`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"get_weather"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{}"}`,
		`{"type":"TOOL_CALL_END","toolCallId":"c1"}`, finishedRun("r1"))
	if err := ct.Finish("r1", call.Events); err != nil {
		t.Fatal(err)
	}
	parts := ct.Messages[1].Parts
	if len(parts) != 2 || parts[0].State != "complete" || string(parts[0].Output) != `{"temp":18}` || parts[1].Type != "tool-result" || ct.Late != nil {
		t.Fatalf("the call after r1's finish = %s, Late %s: want complete with its result", mustJSON(t, parts), mustJSON(t, ct.Late))
	}
}

// TestWithdraw: a withdrawn run (multitaskStrategy rollback) leaves no message and no anchor;
// a run anchored after its message goes where that message was, and its reply lands there.
func TestWithdraw(t *testing.T) {
	var tr thread.Transcript
	if err := tr.Accept("r0", input(t, "r0", "", `{"id":"u0","role":"user","content":"zero"}`)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Finish("r0", reply("r0", "a0", "reply zero")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"one"}`)); err != nil {
		t.Fatal(err)
	}
	// r2 posts no message (a continuation): anchored after u1.
	if err := tr.Accept("r2", input(t, "r2", "")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Accept("r3", input(t, "r3", "", `{"id":"u3","role":"user","content":"three"}`)); err != nil {
		t.Fatal(err)
	}
	tr.Withdraw("r1", []string{"u1"})
	if got, want := summaryOf(tr.Messages), "u0:zero a0:reply zero u3:three"; got != want {
		t.Fatalf("after r1 withdrawn: %s, want %s", got, want)
	}
	if tr.Anchored("r1") {
		t.Fatal("r1 is still anchored after its withdrawal")
	}
	tr = copyTranscript(t, tr)
	if err := tr.Finish("r2", reply("r2", "a2", "reply two")); err != nil {
		t.Fatal(err)
	}
	if got, want := summaryOf(tr.Messages), "u0:zero a0:reply zero a2:reply two u3:three"; got != want {
		t.Fatalf("after r2's finish: %s, want %s", got, want)
	}
}
