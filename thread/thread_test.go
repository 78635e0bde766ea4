package thread_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

func input(t testing.TB, runID string, resume string, msgs ...string) json.RawMessage {
	t.Helper()
	s := `{"threadId":"t","runId":"` + runID + `","messages":[`
	for i, m := range msgs {
		if i > 0 {
			s += ","
		}
		s += m
	}
	s += `]`
	if resume != "" {
		s += `,"resume":` + resume
	}
	return json.RawMessage(s + `}`)
}

const pendingApproval = `{"id":"i1","reason":"approval_required","toolCallId":"c1","metadata":{"kind":"approval","toolName":"get_weather","input":{"city":"Paris"}}}`

// TestInterrupts follows rule 4: a paused run's interrupts are reported
// verbatim until a run that answers them is accepted, and again if that run
// fails.
func TestInterrupts(t *testing.T) {
	var tr thread.Transcript
	r1 := approvalRun()
	if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"weather?"}`)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Finish("r1", r1.Events); err != nil {
		t.Fatal(err)
	}
	if tr.Interrupts == nil || tr.Interrupts.RunID != "r1" || len(tr.Interrupts.Pending) != 1 || string(tr.Interrupts.Pending[0]) != pendingApproval {
		t.Fatalf("after the paused run, Interrupts = %s, want r1 with %s", mustJSON(t, tr.Interrupts), pendingApproval)
	}
	if p := tr.Messages[1].Parts[1]; p.State != "approval-requested" || p.Approval == nil || p.Approval.ID != "i1" {
		t.Fatalf("the call's part = %s, want approval-requested with approval.id i1", mustJSON(t, p))
	}

	answer := input(t, "r2", `[{"interruptId":"i1","status":"resolved","payload":{"approved":true}}]`)
	if err := tr.Accept("r2", answer); err != nil {
		t.Fatal(err)
	}
	if tr.Interrupts != nil {
		t.Fatalf("after accepting the answering run, Interrupts = %s, want none", mustJSON(t, tr.Interrupts))
	}
	if p := tr.Messages[1].Parts[1]; p.State != "approval-responded" || p.Approval.Approved == nil || !*p.Approval.Approved {
		t.Fatalf("the call's part = %s, want approval-responded, approved", mustJSON(t, p))
	}
	// The store keeps the transcript as JSON while r2 runs.
	var stored thread.Transcript
	if err := json.Unmarshal(mustJSON(t, tr), &stored); err != nil {
		t.Fatal(err)
	}
	failed := run("r2", nil, startedRun("r2"), `{"type":"RUN_ERROR","message":"agent failed","code":"agent_error"}`)
	if err := stored.Finish("r2", failed.Events); err != nil {
		t.Fatal(err)
	}
	if stored.Interrupts == nil || stored.Interrupts.RunID != "r1" || string(stored.Interrupts.Pending[0]) != pendingApproval {
		t.Fatalf("after the answering run failed, Interrupts = %s, want r1's again", mustJSON(t, stored.Interrupts))
	}

	if err := tr.Finish("r2", answerRun(true).Events); err != nil {
		t.Fatal(err)
	}
	if tr.Interrupts != nil || tr.Answered != nil {
		t.Fatalf("after the answering run finished, Interrupts = %s, Answered = %v, want none", mustJSON(t, tr.Interrupts), tr.Answered)
	}
}

func ids(msgs []thread.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	return out
}

// TestActive checks what a hydrate shows mid-run: rule 1 (only the run's
// latest assistant message) and rule 2 (a continuation run's placeholder).
func TestActive(t *testing.T) {
	var tr thread.Transcript
	if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	// Nothing streamed yet: the settled messages with the run's user message.
	r := run("r1", nil, startedRun("r1"))
	if got := ids(tr.Active("r1", r.Events)); fmt.Sprint(got) != "[u1]" {
		t.Errorf("Active before any reply = %v, want [u1]", got)
	}
	// Two assistant messages so far: only the latest.
	r = run("r1", nil, startedRun("r1"),
		`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"one"}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`,
		`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"two"}`)
	got := tr.Active("r1", r.Events)
	if fmt.Sprint(ids(got)) != "[u1 m2]" || got[1].Parts[0].Content != "two" {
		t.Errorf("Active mid-run = %s, want u1 then m2 with \"two\"", mustJSON(t, got))
	}
	// Active does not change the transcript.
	if fmt.Sprint(ids(tr.Messages)) != "[u1]" {
		t.Errorf("after Active, Messages = %v, want [u1]", ids(tr.Messages))
	}

	// A continuation run (an approval answer, no new user message).
	var paused thread.Transcript
	_ = paused.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"weather?"}`))
	_ = paused.Finish("r1", approvalRun().Events)
	_ = paused.Accept("r2", input(t, "r2", `[{"interruptId":"i1","status":"resolved","payload":{"approved":true}}]`))
	got = paused.Active("r2", run("r2", nil, startedRun("r2")).Events)
	if fmt.Sprint(ids(got)) != "[u1 m1 r2-pending]" || got[2].Role != "assistant" || len(got[2].Parts) != 0 {
		t.Errorf("Active of a continuation run with no reply = %s, want u1, m1, then an empty r2-pending", mustJSON(t, got))
	}
	if b := mustJSON(t, got[2]); string(b) != `{"id":"r2-pending","role":"assistant","parts":[]}` {
		t.Errorf("placeholder = %s", b)
	}
	got = paused.Active("r2", answerRun(true).Events[:5])
	if fmt.Sprint(ids(got)) != "[u1 m1 m2]" {
		t.Errorf("Active of a continuation run with a reply = %v, want [u1 m1 m2]", ids(got))
	}
}

func messages(n int) []thread.Message {
	out := make([]thread.Message, n)
	for i := range out {
		out[i] = thread.Message{ID: "m" + strconv.Itoa(i), Role: "user"}
	}
	return out
}

// TestPage walks every transcript size and page size from the newest page
// by cursors: every message exactly once, oldest first, the first reached,
// never an empty page for an issued cursor.
func TestPage(t *testing.T) {
	for n := 0; n <= 12; n++ {
		for limit := 1; limit <= 13; limit++ {
			msgs := messages(n)
			var seen []string
			before := ""
			for pages := 0; ; pages++ {
				w, cursor := thread.Page(msgs, limit, before)
				if before != "" && len(w) == 0 {
					t.Fatalf("n=%d limit=%d: Page(before=%q) is empty", n, limit, before)
				}
				if len(w) > limit {
					t.Fatalf("n=%d limit=%d: a page of %d", n, limit, len(w))
				}
				seen = append(ids(w), seen...)
				if cursor == "" {
					break
				}
				if cursor != w[0].ID {
					t.Fatalf("n=%d limit=%d: cursor %q, want the window's oldest %q", n, limit, cursor, w[0].ID)
				}
				before = cursor
				if pages > n {
					t.Fatalf("n=%d limit=%d: no end", n, limit)
				}
			}
			if fmt.Sprint(seen) != fmt.Sprint(ids(msgs)) {
				t.Fatalf("n=%d limit=%d: pages gave %v, want %v", n, limit, seen, ids(msgs))
			}
		}
	}
	all := messages(600)
	if w, c := thread.Page(all, 0, ""); len(w) != 600 || c != "" {
		t.Errorf("Page(limit 0) = %d messages, cursor %q; want all 600, no cursor", len(w), c)
	}
	if w, c := thread.Page(all, 10000, ""); len(w) != thread.MaxPage || c != "m100" {
		t.Errorf("Page(limit 10000) = %d messages, cursor %q; want %d, m100", len(w), c, thread.MaxPage)
	}
	if w, c := thread.Page(all, 10, "gone"); len(w) != 0 || c != "" {
		t.Errorf("Page(before an unknown id) = %d messages, cursor %q; want none", len(w), c)
	}
}
