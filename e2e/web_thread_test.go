package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// elsewhere is what the page shows as the message of a turn started in another tab.
const elsewhere = "Sent from another tab or device"

// TestWebThreadTwoTabs opens two pages on one thread (the second on the first's address): a
// message sent in page 1 streams in page 2; Stop pressed in page 2 stops it in both, which
// then show the same reply; a message sent in page 2 reaches page 1, once.
func TestWebThreadTwoTabs(t *testing.T) {
	g := startGateway(t)
	browser := startBrowser(t)
	p1 := openPage(t, browser, g.URL+"/")
	hash := eval[string](p1, `location.hash`)
	if !strings.HasPrefix(hash, "#thread=thread-") {
		t.Fatalf("page address %q does not name its thread", hash)
	}
	p2 := openPage(t, browser, g.URL+"/"+hash)
	thread := strings.TrimPrefix(hash, "#thread=")
	p2.waitFor("page 2 to follow the thread", `document.querySelector("#connection").dataset.state === "connected"`)
	for i, p := range []*page{p1, p2} {
		if f := p.followFrames(); len(f) != 1 || f[0] != "follow "+thread {
			t.Errorf("page %d sent follow frames %q, want one of %s", i+1, f, thread)
		}
	}

	const tokens = 2000
	p1.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p1.send("from tab one")
	p2.waitReplyLen(0, len(tokensReply(10)))
	if got := p2.turn(0); got.Status != "running" || got.User != elsewhere || got.RunID != p1.turn(0).RunID {
		t.Fatalf("page 2 shows %+v, want page 1's turn running, started elsewhere", got)
	}
	p2.do(chromedp.Click(chromedp.CSS("#stop")))
	got2 := p2.waitStatus(0, "stopped")
	got1 := p1.waitStatus(0, "stopped")
	full := tokensReply(tokens)
	if got1.Reply != got2.Reply || !strings.HasPrefix(full, got1.Reply) || len(got1.Reply) >= len(full) {
		t.Errorf("stopped replies: page 1 %d characters, page 2 %d: want the same strict prefix of the full reply", len(got1.Reply), len(got2.Reply))
	}
	for i, got := range []turnState{got1, got2} {
		if got.StatusLine != "Stopped" || strings.Contains(got.Note, "Stopped following") {
			t.Errorf("page %d: status line %q, note %q; want Stopped (RUN_ERROR aborted)", i+1, got.StatusLine, got.Note)
		}
	}
	if f := p2.sentFrames(); len(f) != 1 || f[0].Type != "abort" || f[0].RunID != got1.RunID {
		t.Errorf("page 2 sent %+v, want one abort of %s", f, got1.RunID)
	}

	p2.setOptions(demoOptions{})
	p2.send("from tab two")
	if got := p2.waitStatus(1, "done"); got.Reply != "You said: from tab two" {
		t.Errorf("page 2's own reply = %q", got.Reply)
	}
	got := p1.waitStatus(1, "done")
	if got.Reply != "You said: from tab two" || got.User != elsewhere || got.Texts != 1 {
		t.Errorf("page 1 shows page 2's turn as %+v", got)
	}
	if n := len(p1.turns()); n != 2 {
		t.Errorf("page 1 shows %d turns, want 2", n)
	}
}

// TestWebStopAfterCut cuts the page's TCP connections mid-turn and presses Stop at once, while
// the page has no working socket: the turn ends stopped (RUN_ERROR aborted), never "stopped
// following".
func TestWebStopAfterCut(t *testing.T) {
	g := startGateway(t)
	px := tcpproxy.Start(t, g.Addr, nil)
	p := openPage(t, startBrowser(t), "http://"+px.Addr()+"/")
	const tokens = 2000
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p.send("cut, then stop")
	p.waitReplyLen(0, len(tokensReply(10)))
	if n := px.Cut(); n == 0 {
		t.Fatal("Cut found no connection to cut")
	}
	p.do(chromedp.Click(chromedp.CSS("#stop")))
	got := p.waitStatus(0, "stopped")
	if got.StatusLine != "Stopped" || strings.Contains(got.Note, "Stopped following") {
		t.Errorf("status line %q, note %q; want Stopped by the gateway", got.StatusLine, got.Note)
	}
	full := tokensReply(tokens)
	if !strings.HasPrefix(full, got.Reply) || len(got.Reply) >= len(full) {
		t.Errorf("stopped reply (%d characters) is not a strict prefix of the full reply", len(got.Reply))
	}
	p.setOptions(demoOptions{})
	p.send("after the stop")
	if got := p.waitStatus(1, "done"); got.Reply != "You said: after the stop" {
		t.Errorf("reply after the stop = %q", got.Reply)
	}
}

// TestWebStopAfterReload reloads the page mid-turn and presses Stop on the rejoined turn: it
// ends stopped (RUN_ERROR aborted).
func TestWebStopAfterReload(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")
	const tokens = 2000
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p.send("reload, then stop")
	p.waitReplyLen(0, len(tokensReply(10)))
	p.do(chromedp.Reload())
	p.waitReady()
	p.waitReplyLen(0, len(tokensReply(20)))
	if got := p.turn(0); got.Status != "running" || got.User != "reload, then stop" {
		t.Fatalf("turn after the reload: %+v, want it running", got)
	}
	p.do(chromedp.Click(chromedp.CSS("#stop")))
	got := p.waitStatus(0, "stopped")
	if got.StatusLine != "Stopped" || strings.Contains(got.Note, "Stopped following") {
		t.Errorf("status line %q, note %q; want Stopped by the gateway", got.StatusLine, got.Note)
	}
	if n := len(p.turns()); n != 1 {
		t.Errorf("the page shows %d turns after the reload, want 1", n)
	}
}

// TestWebQueue: a message sent while a reply streams is queued behind it (multitaskStrategy
// enqueue): its turn shows "Queued: 1 reply ahead", on the page that sent it and on a second
// page following the thread, then starts once the first reply has ended, and is answered;
// the page posts the new message alone.
func TestWebQueue(t *testing.T) {
	g := startGateway(t)
	browser := startBrowser(t)
	p1 := openPage(t, browser, g.URL+"/")
	hash := eval[string](p1, `location.hash`)
	p2 := openPage(t, browser, g.URL+"/"+hash)
	p2.waitFor("page 2 to follow the thread", `document.querySelector("#connection").dataset.state === "connected"`)

	const tokens = 150
	p1.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p1.send("a long one")
	p1.waitReplyLen(0, len(tokensReply(5)))
	p1.setOptions(demoOptions{})
	p1.sendNow("queued behind it")
	for i, p := range []*page{p1, p2} {
		p.waitFor(fmt.Sprintf("page %d to show the second turn queued", i+1),
			`document.querySelectorAll("#conversation .turn")[1]?.dataset.queued === "true"`)
		if got := p.turn(1); got.StatusLine != "Queued: 1 reply ahead" || got.Reply != "" || p.turn(0).Status != "running" {
			t.Errorf("page %d: the queued turn shows %+v while the first streams", i+1, got)
		}
	}
	for i, p := range []*page{p1, p2} {
		first := p.waitStatus(0, "done")
		second := p.waitStatus(1, "done")
		if first.Reply != tokensReply(tokens) || second.Reply != "You said: queued behind it" || second.StatusLine != "" {
			t.Errorf("page %d: turns %+v then %+v", i+1, first, second)
		}
	}
	if f := p1.sentFrames(); len(f) != 2 || f[1].MultitaskStrategy != "enqueue" || len(f[1].Messages) != 1 {
		t.Errorf("page 1 sent %+v; want the second run frame with multitaskStrategy enqueue and its new message alone", f)
	}
}

// TestWebBranches (THREADS.md section 7): Regenerate on the last reply, twice, answers the
// message again each time and shows ‹ 3 / 3 ›, on a second page on the thread too (the new
// reply in place of the old, not below it); ‹ switches to the second reply (‹ 2 / 3 ›), and
// the second page shows the same branch, all without a reload.
func TestWebBranches(t *testing.T) {
	g := startGateway(t)
	browser := startBrowser(t)
	p1 := openPage(t, browser, g.URL+"/")
	hash := eval[string](p1, `location.hash`)
	p2 := openPage(t, browser, g.URL+"/"+hash)
	p2.waitFor("page 2 to follow the thread", `document.querySelector("#connection").dataset.state === "connected"`)

	const branchJS = `(document.querySelector("#conversation .turn:last-child [data-role=branch-position]")?.textContent ?? "")`
	p1.send("hello")
	p1.waitStatus(0, "done")
	for i, tokens := range []int{3, 5} {
		p1.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "0"})
		p1.waitFor("the Regenerate button", `!document.querySelector("#conversation .turn:last-child [data-role=regenerate]").hidden`)
		p1.do(chromedp.Click(chromedp.CSS("#conversation .turn:last-child [data-role=regenerate]")))
		// The reply ends, then thread.branch re-shows the thread with ‹ n / n ›: clicked
		// before that, the next Regenerate would be a button the re-show replaces.
		p1.waitFor(fmt.Sprintf("the reply of %d tokens, ‹ %d / %d ›", tokens, i+2, i+2), fmt.Sprintf(
			`%s === "%d / %d" && document.querySelectorAll("#conversation .turn").length === 1 && document.querySelector("#conversation .turn").dataset.status === "done" && document.querySelector("#conversation .turn [data-role=assistant-text]")?.textContent === %q`, branchJS, i+2, i+2, tokensReply(tokens)))
	}
	third := fmt.Sprintf(`%s === "3 / 3" && document.querySelectorAll("#conversation .turn").length === 1 && document.querySelector("#conversation .turn [data-role=assistant-text]")?.textContent === %q`, branchJS, tokensReply(5))
	p2.waitFor("page 2 to show the regenerated reply in place, ‹ 3 / 3 ›", third)
	if got := p1.turn(0); got.User != "hello" {
		t.Fatalf("after two regenerates the page shows %+v", got)
	}
	p1.do(chromedp.Click(chromedp.CSS("#conversation .turn:last-child [data-role=branch-prev]")))
	second := fmt.Sprintf(`%s === "2 / 3" && document.querySelectorAll("#conversation .turn").length === 1 && document.querySelector("#conversation .turn [data-role=assistant-text]")?.textContent === %q`, branchJS, tokensReply(3))
	p1.waitFor("‹ 2 / 3 › with the second reply", second)
	p2.waitFor("page 2 to show ‹ 2 / 3 › with the second reply", second)
	if got := p2.turns(); len(got) != 1 || got[0].User != "hello" {
		t.Errorf("page 2 shows %+v, want the second reply of hello", got)
	}
}
