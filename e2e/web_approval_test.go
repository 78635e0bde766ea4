package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// What the demo agent replies to an answered approval.
const (
	demoApproved = "Approved: it is 18 °C in Paris."
	demoDeclined = "Declined: I did not check the weather."
)

// askApproval sends text with the approval option and waits for the turn (i) to end asking
// for approval: its get_weather call shown, Approve and Deny enabled.
func askApproval(t *testing.T, p *page, i int, text string) turnState {
	t.Helper()
	p.setOptions(demoOptions{IntervalMs: "0", Approval: true})
	p.send(text)
	got := p.waitStatus(i, "done")
	if got.Reply != "You said: "+text || got.Approval != "pending" || len(got.Tools) != 1 || got.Tools[0].Name != demoToolName {
		t.Fatalf("turn %d = %+v, want the reply, a %s call and an approval pending", i, got, demoToolName)
	}
	return got
}

// answer presses Approve (or Deny) on turn i.
func answer(p *page, i int, approve bool) {
	p.tb.Helper()
	role := "deny"
	if approve {
		role = "approve"
	}
	p.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`#conversation article.turn:nth-of-type(%d) [data-role=approval] button[data-role=%s]`, i+1, role))))
}

// checkContinuation checks the run frame the page sent for an answer: a new run of the thread,
// parentRunId the paused run, resume resolving its one interrupt with payload.approved.
func checkContinuation(t *testing.T, f runFrame, threadID, paused, runID string, approved bool) {
	t.Helper()
	want := paused + ".approval-call1.approval"
	if f.Type != "" || f.ThreadID != threadID || f.RunID != runID || f.RunID == paused || f.ParentRunID != paused ||
		len(f.Resume) != 1 || f.Resume[0].InterruptID != want || f.Resume[0].Status != "resolved" ||
		f.Resume[0].Payload.Approved == nil || *f.Resume[0].Payload.Approved != approved {
		t.Errorf("continuation frame %+v: want run %s of thread %s, parentRunId %s, resume [{%s resolved {approved %v}}]",
			f, runID, threadID, paused, want, approved)
	}
}

// TestWebApproval: a turn that asks to approve a tool call shows Approve and Deny; Approve
// sends a continuation run and the agent's approved reply streams as a new turn, with the
// call's result; Deny likewise gets the declined reply; the buttons are disabled once pressed.
func TestWebApproval(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")
	threadID := strings.TrimPrefix(eval[string](p, `location.hash`), "#thread=")

	for _, tt := range []struct {
		approve bool
		answer  string
		reply   string
		result  bool
	}{
		{approve: true, answer: "Approved", reply: demoApproved, result: true},
		{approve: false, answer: "Denied", reply: demoDeclined},
	} {
		i := len(p.turns())
		paused := askApproval(t, p, i, "weather, "+tt.answer)
		answer(p, i, tt.approve)
		got := p.waitStatus(i+1, "done")
		if got.Reply != tt.reply {
			t.Errorf("reply after %s = %q, want %q", tt.answer, got.Reply, tt.reply)
		}
		if got.User != tt.answer+" "+demoToolName {
			t.Errorf("the continuation's message shows %q, want %q", got.User, tt.answer+" "+demoToolName)
		}
		if tt.result != (len(got.Tools) == 1 && strings.Contains(got.Tools[0].Result, `"temperature": 18`)) {
			t.Errorf("continuation after %s shows tool calls %+v; want the call's result: %v", tt.answer, got.Tools, tt.result)
		}
		if a := p.turn(i).Approval; a != tt.answer {
			t.Errorf("the paused turn shows approval %q after %s was pressed, want the buttons disabled and %q", a, tt.answer, tt.answer)
		}
		frames := p.sentFrames()
		checkContinuation(t, frames[len(frames)-1], threadID, paused.RunID, got.RunID, tt.approve)
	}
	// The thread goes on as usual.
	p.setOptions(demoOptions{})
	p.send("thanks")
	if got := p.waitStatus(4, "done"); got.Reply != "You said: thanks" || got.Approval != "" {
		t.Errorf("the turn after the answers = %+v", got)
	}
}

// TestWebApprovalAfterReload: the page is reloaded while a turn waits for approval; the
// question is shown again (sessionStorage) and approving it completes the thread.
func TestWebApprovalAfterReload(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")
	paused := askApproval(t, p, 0, "reload before approving")
	p.do(chromedp.Reload())
	p.waitReady()
	if got := p.turn(0); got.Approval != "pending" || got.RunID != paused.RunID || got.Reply != paused.Reply {
		t.Fatalf("after the reload the turn shows %+v, want %+v with the approval pending", got, paused)
	}
	answer(p, 0, true)
	if got := p.waitStatus(1, "done"); got.Reply != demoApproved {
		t.Errorf("reply after approving = %q, want %q", got.Reply, demoApproved)
	}
	if f := p.sentFrames(); len(f) != 2 || f[1].ParentRunID != paused.RunID || len(f[1].Resume) != 1 {
		t.Errorf("the page sent %+v, want the question's run frame, then a continuation of %s", f, paused.RunID)
	}
	p.do(chromedp.Reload())
	p.waitReady()
	if got := p.turns(); len(got) != 2 || got[0].Approval != "Approved" || got[1].Reply != demoApproved {
		t.Errorf("after a second reload the page shows %+v", got)
	}
}

// TestWebApprovalFromAddress: a browser with a new profile opens the thread from the address
// of the page that asked; the question is shown from the server's thread, and approving it
// there completes the thread: the first page (which follows the thread) shows the answer
// given elsewhere, and a third browser sees the thread answered (the buttons disabled).
func TestWebApprovalFromAddress(t *testing.T) {
	g := startGateway(t)
	p1 := openPage(t, startBrowser(t), g.URL+"/")
	hash := eval[string](p1, `location.hash`)
	askApproval(t, p1, 0, "approve from elsewhere")

	p2 := openPage(t, startBrowser(t), g.URL+"/"+hash)
	p2.waitFor("the hydrated approval", `document.querySelector("#conversation .turn [data-role=approval]")`)
	got := p2.turn(0)
	if got.Approval != "pending" || got.User != "approve from elsewhere" || got.Reply != "You said: approve from elsewhere" ||
		len(got.Tools) != 1 || got.Tools[0].Name != demoToolName {
		t.Fatalf("the second browser shows %+v, want the paused turn with its approval pending", got)
	}
	answer(p2, 0, true)
	if got := p2.waitStatus(1, "done"); got.Reply != demoApproved {
		t.Errorf("reply after approving = %q, want %q", got.Reply, demoApproved)
	}
	if got := p2.turn(0); got.Approval != "Approved" {
		t.Errorf("the second browser's paused turn shows approval %q, want Approved", got.Approval)
	}

	p1.waitStatus(1, "done")
	if got := p1.turns(); got[0].Approval != "Answered elsewhere" || got[1].Reply != demoApproved || got[1].User != elsewhere {
		t.Errorf("the first page shows %+v, want the approval answered elsewhere and the approved reply", got)
	}

	p3 := openPage(t, startBrowser(t), g.URL+"/"+hash)
	p3.waitFor("the hydrated thread", `document.querySelectorAll("#conversation .turn").length > 0`)
	got = p3.turn(0)
	if got.Approval != "Approved" || !strings.HasSuffix(got.Reply, demoApproved) || len(got.Tools) != 1 ||
		!strings.Contains(got.Tools[0].Result, `"temperature": 18`) {
		t.Errorf("a third browser shows %+v, want the approved reply and the call's result, the approval answered", got)
	}
}

// TestWebApprovalOpenedWhileAnswering: a browser opens the thread while the answer's
// continuation runs: it shows the paused turn as answered (Approve and Deny disabled), and the
// continuation running as a turn of its own, which Stop there stops in both pages.
func TestWebApprovalOpenedWhileAnswering(t *testing.T) {
	g := startGateway(t)
	p1 := openPage(t, startBrowser(t), g.URL+"/")
	hash := eval[string](p1, `location.hash`)
	paused := askApproval(t, p1, 0, "open while answering")
	// The continuation's events after RUN_STARTED are a minute apart: it runs until stopped.
	p1.setOptions(demoOptions{IntervalMs: "60000"})
	answer(p1, 0, true)
	p1.waitStatus(1, "running")

	p2 := openPage(t, startBrowser(t), g.URL+"/"+hash)
	p2.waitFor("two turns", `document.querySelectorAll("#conversation .turn").length === 2`)
	if got := p2.turn(1); got.Status != "running" || got.RunID != p1.turn(1).RunID || got.User != "Approved "+demoToolName {
		t.Errorf("the continuation shows %+v, want it running, a turn of its own", got)
	}
	if got := p2.turn(0); got.Reply != paused.Reply || got.User != paused.User || got.Approval != "Approved" {
		t.Errorf("the paused turn shows %+v, want %q, %q, approval answered", got, paused.User, paused.Reply)
	}
	p2.do(chromedp.Click(chromedp.CSS("#stop")))
	p2.waitStatus(1, "stopped")
	p1.waitStatus(1, "stopped")
}
