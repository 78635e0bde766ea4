package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"image/png"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
	"github.com/wsgateway/wsgateway/internal/testenv"
)

var updateScreenshots = flag.Bool("update-screenshots", false, "write docs/screenshot-light.png and docs/screenshot-dark.png from TestWebScreenshots")

// tokensReply is the demo agent's reply with tokens deltas: "t1 t2 … tN ".
func tokensReply(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString("t" + strconv.Itoa(i) + " ")
	}
	return b.String()
}

// The demo agent's reasoning message and tool call (agent/demo).
const (
	demoReasoning = "The user wants a reply; I will answer."
	demoToolName  = "get_weather"
)

// TestWebSendMessage sends messages from the page and checks each reply renders exactly as the
// demo agent wrote it, with its reasoning and tool call, in one conversation.
func TestWebSendMessage(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")
	if got := p.connectionState(); got != "connected" && got != "connecting" {
		t.Errorf("connection state at start = %q, want connecting or connected", got)
	}

	tests := []struct {
		name       string
		opts       demoOptions
		message    string
		wantReply  string
		wantTool   bool
		wantReason bool
	}{
		{name: "echo", message: "hello durable world", wantReply: "You said: hello durable world"},
		{name: "tokens with reasoning and tool call", opts: demoOptions{Tokens: "40", IntervalMs: "0", ToolCall: true, Reasoning: true},
			message: "weather?", wantReply: tokensReply(40), wantTool: true, wantReason: true},
		{name: "history with reasoning sent back", message: "a second turn,  two spaces kept", wantReply: "You said: a second turn,  two spaces kept"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.tb = t
			p.setOptions(tt.opts)
			p.send(tt.message)
			got := p.waitStatus(i, "done")
			if got.User != tt.message {
				t.Errorf("user message shown = %q, want %q", got.User, tt.message)
			}
			if got.Reply != tt.wantReply {
				t.Errorf("reply shown = %q, want %q", got.Reply, tt.wantReply)
			}
			if got.Texts != 1 {
				t.Errorf("reply rendered in %d text blocks, want 1", got.Texts)
			}
			if got.StatusLine != "" || got.Busy != "false" {
				t.Errorf("finished turn shows status %q, aria-busy %q; want no status line, aria-busy false", got.StatusLine, got.Busy)
			}
			if tt.wantReason {
				if len(got.Reasoning) != 1 || got.Reasoning[0] != demoReasoning {
					t.Errorf("reasoning shown = %q, want [%q]", got.Reasoning, demoReasoning)
				}
			} else if len(got.Reasoning) != 0 {
				t.Errorf("reasoning shown = %q, want none", got.Reasoning)
			}
			if tt.wantTool {
				if len(got.Tools) != 1 || got.Tools[0].Name != demoToolName {
					t.Fatalf("tool calls shown = %+v, want one %s", got.Tools, demoToolName)
				}
				var args map[string]any
				if err := json.Unmarshal([]byte(got.Tools[0].Args), &args); err != nil || len(args) == 0 {
					t.Errorf("tool call arguments shown = %q: want a JSON object (%v)", got.Tools[0].Args, err)
				}
			} else if len(got.Tools) != 0 {
				t.Errorf("tool calls shown = %+v, want none", got.Tools)
			}
		})
	}
	p.tb = t
	turns := p.turns()
	if len(turns) != len(tests) {
		t.Fatalf("the page shows %d turns, want %d", len(turns), len(tests))
	}
	checkRunFrames(t, p.sentFrames(), turns, []map[string]any{
		{},
		{"tokens": 40.0, "intervalMs": 0.0, "toolCall": true, "reasoning": true},
		{},
	}, [][]string{
		{"user"},
		{"user", "assistant", "user"},
		{"user", "assistant", "user", "reasoning", "assistant", "user"},
	})
	if got := p.connectionState(); got != "connected" {
		t.Errorf("connection state = %q, want connected", got)
	}
}

// checkRunFrames checks the run frames the page sent, one per turn: one threadId for the
// conversation, the turn's runId, the history (roles in order, unique ids, the assistant
// message ids of the demo agent's replies, the turn's own message last), tools and context
// empty, and the options panel in forwardedProps.demo.
func checkRunFrames(t *testing.T, frames []runFrame, turns []turnState, demos []map[string]any, roles [][]string) {
	t.Helper()
	if len(frames) != len(turns) {
		t.Fatalf("the page sent %d frames, want %d run frames: %+v", len(frames), len(turns), frames)
	}
	for i, f := range frames {
		if f.Type != "" || f.ThreadID == "" || f.ThreadID != frames[0].ThreadID || f.RunID != turns[i].RunID {
			t.Errorf("frame %d: type %q, threadId %q (first %q), runId %q: want a run frame of the thread for runId %q",
				i, f.Type, f.ThreadID, frames[0].ThreadID, f.RunID, turns[i].RunID)
		}
		if string(f.Tools) != "[]" || string(f.Context) != "[]" {
			t.Errorf("frame %d: tools %s, context %s; want [] and []", i, f.Tools, f.Context)
		}
		if !reflect.DeepEqual(f.ForwardedProps.Demo, demos[i]) {
			t.Errorf("frame %d: forwardedProps.demo = %v, want %v", i, f.ForwardedProps.Demo, demos[i])
		}
		var got []string
		ids := map[string]bool{}
		for _, m := range f.Messages {
			got = append(got, m.Role)
			if m.ID == "" || ids[m.ID] {
				t.Errorf("frame %d: message id %q empty or repeated", i, m.ID)
			}
			ids[m.ID] = true
		}
		if !slices.Equal(got, roles[i]) {
			t.Errorf("frame %d: message roles %q, want %q", i, got, roles[i])
			continue
		}
		if last := f.Messages[len(f.Messages)-1]; string(last.Content) != strconv.Quote(turns[i].User) {
			t.Errorf("frame %d: last message content %s, want %q", i, last.Content, turns[i].User)
		}
		if i > 0 && f.Messages[1].ID != turns[0].RunID+".msg1" {
			t.Errorf("frame %d: first assistant message id %q, want the reply's messageId %q", i, f.Messages[1].ID, turns[0].RunID+".msg1")
		}
	}
}

// resumeOffsets returns the offsets of the resume sockets the page opened for runID.
func resumeOffsets(t *testing.T, urls []string, runID string) []string {
	t.Helper()
	var out []string
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("the page opened a WebSocket at %q: %v", raw, err)
		}
		if q := u.Query(); u.Path == "/ws" && q.Get("runId") == runID && q.Has("offset") {
			out = append(out, q.Get("offset"))
		}
	}
	return out
}

// TestWebResumeAfterDrop cuts the page's TCP connections mid-turn: the page shows it is
// reconnecting, resumes after the last offset it saw, and renders the complete reply with no
// token missing or repeated; the conversation then goes on.
func TestWebResumeAfterDrop(t *testing.T) {
	g := startGateway(t)
	px := tcpproxy.Start(t, g.Addr, nil)
	p := openPage(t, startBrowser(t), "http://"+px.Addr()+"/")

	const tokens = 200
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "25"})
	p.send("stream through a cut")
	p.waitReplyLen(0, len(tokensReply(15)))
	p.recordStates()
	accepted := px.Accepted()
	if n := px.Cut(); n == 0 {
		t.Fatal("Cut found no connection to cut")
	}
	before := p.turn(0)
	if before.Status != "running" || len(before.Reply) >= len(tokensReply(tokens)) {
		t.Fatalf("turn before the cut: status %q, %d characters: want running and incomplete", before.Status, len(before.Reply))
	}

	got := p.waitStatus(0, "done")
	if want := tokensReply(tokens); got.Reply != want {
		t.Errorf("reply after the cut = %q\nwant %q", got.Reply, want)
	}
	if !strings.Contains(got.Note, "Connection lost, reconnecting…") || !strings.Contains(got.Note, "Resumed") {
		t.Errorf("turn note = %q, want it to say the connection was lost and the reply resumed", got.Note)
	}
	states := p.states()
	if i := slices.Index(states, "reconnecting"); i < 0 || !slices.Contains(states[i:], "resumed") {
		t.Errorf("connection states shown after the cut = %q, want reconnecting then resumed", states)
	}
	if px.Accepted() <= accepted {
		t.Errorf("no new connection after the cut (accepted %d, before %d)", px.Accepted(), accepted)
	}
	if offsets := resumeOffsets(t, p.socketURLs(), got.RunID); len(offsets) == 0 || offsets[0] == "-1" || offsets[0] == "" {
		t.Errorf("resume sockets after the cut have offsets %q, want the last offset seen (not -1)", offsets)
	}

	p.setOptions(demoOptions{})
	p.send("still there?")
	if got := p.waitStatus(1, "done"); got.Reply != "You said: still there?" {
		t.Errorf("reply after the resume = %q, want %q", got.Reply, "You said: still there?")
	}
	p.waitFor("the connection to be shown as connected", `document.querySelector("#connection").dataset.state === "connected"`)
}

// TestWebStop stops a turn mid-stream: the turn ends, the page says it was stopped and renders
// nothing more of it, and the next message works.
func TestWebStop(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")

	const tokens = 2000
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p.send("a long one")
	p.waitReplyLen(0, len(tokensReply(10)))
	p.do(chromedp.Click(chromedp.CSS("#stop")))

	got := p.waitStatus(0, "stopped")
	if frames := p.sentFrames(); len(frames) != 2 || frames[1].Type != "abort" || frames[1].RunID != got.RunID {
		t.Errorf("frames sent = %+v, want the run frame then an abort of %q", frames, got.RunID)
	}
	if got.StatusLine != "Stopped" || strings.Contains(got.Note, "Stopped following") {
		t.Errorf("status line = %q, note %q: want %q, stopped by the gateway (RUN_ERROR aborted)", got.StatusLine, got.Note, "Stopped")
	}
	full := tokensReply(tokens)
	if !strings.HasPrefix(full, got.Reply) || len(got.Reply) >= len(full) {
		t.Errorf("stopped reply (%d characters) is not a strict prefix of the full reply: %q", len(got.Reply), got.Reply)
	}
	time.Sleep(300 * time.Millisecond) // longer than many event intervals
	if later := p.turn(0); later.Reply != got.Reply || later.Status != "stopped" {
		t.Errorf("after the stop the turn changed: status %q, %d characters, want stopped, %d", later.Status, len(later.Reply), len(got.Reply))
	}

	p.setOptions(demoOptions{})
	p.send("after the stop")
	if got := p.waitStatus(1, "done"); got.Reply != "You said: after the stop" {
		t.Errorf("reply after the stop = %q, want %q", got.Reply, "You said: after the stop")
	}
	// Escape in the composer stops a turn too.
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "20"})
	p.send("stop me with the keyboard")
	p.waitReplyLen(2, len(tokensReply(5)))
	p.do(chromedp.SendKeys(chromedp.CSS("#prompt"), "\x1b"))
	p.waitStatus(2, "stopped")
}

// TestWebReload reloads the page mid-turn: the page rejoins the turn from the start of its log
// and shows the reply to its end, once; a second reload shows the finished conversation as it
// was, without asking the gateway again.
func TestWebReload(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")

	p.send("first")
	p.waitStatus(0, "done")
	const tokens = 200
	p.setOptions(demoOptions{Tokens: strconv.Itoa(tokens), IntervalMs: "25"})
	p.send("survive a reload")
	p.waitReplyLen(1, len(tokensReply(12)))
	before := p.turn(1)
	if before.Status != "running" {
		t.Fatalf("turn before the reload is %q, want running", before.Status)
	}
	runID := before.RunID

	p.do(chromedp.Reload())
	p.waitReady()
	got := p.waitStatus(1, "done")
	if got.RunID != runID {
		t.Errorf("turn after the reload has runId %q, want %q", got.RunID, runID)
	}
	if want := tokensReply(tokens); got.Reply != want || got.Texts != 1 {
		t.Errorf("reply after the reload (%d text blocks) = %q\nwant once %q", got.Texts, got.Reply, want)
	}
	if offsets := resumeOffsets(t, p.socketURLs(), runID); !slices.Equal(offsets, []string{"-1"}) {
		t.Errorf("resume sockets of the turn after the reload have offsets %q, want one from the start (-1)", offsets)
	}
	if !strings.Contains(got.Note, "Rejoined after a reload") {
		t.Errorf("turn note = %q, want it to say the reply was rejoined", got.Note)
	}
	turns := p.turns()
	if len(turns) != 2 || turns[0].Reply != "You said: first" || turns[0].User != "first" {
		t.Fatalf("turns after the reload = %+v, want the first turn kept and the second rejoined", turns)
	}

	p.do(chromedp.Reload())
	p.waitReady()
	again := p.turns()
	if len(again) != 2 {
		t.Fatalf("turns after a second reload = %d, want 2", len(again))
	}
	for i, want := range []string{"You said: first", tokensReply(tokens)} {
		if turn := again[i]; turn.Status != "done" || turn.Reply != want || turn.Texts != 1 {
			t.Errorf("turn %d after a second reload: status %q, reply %q in %d blocks, want done, %q in 1",
				i, turn.Status, turn.Reply, turn.Texts, want)
		}
	}
	p.setOptions(demoOptions{})
	p.send("and on")
	if got := p.waitStatus(2, "done"); got.Reply != "You said: and on" {
		t.Errorf("reply after the reloads = %q, want %q", got.Reply, "You said: and on")
	}
}

// TestWebFollowingSocketStaysOpen: the page follows its thread, so the gateway never closes
// its socket for inactivity (--idle-timeout 1s, pings every 200 ms): the page stays
// connected without opening another socket, and a long turn completes.
func TestWebFollowingSocketStaysOpen(t *testing.T) {
	g := startGateway(t, "--idle-timeout", "1s", "--heartbeat", "200ms")
	p := openPage(t, startBrowser(t), g.URL+"/")
	p.waitFor("the connection to be shown as connected", `document.querySelector("#connection").dataset.state === "connected"`)
	opened := len(p.socketURLs())
	time.Sleep(2500 * time.Millisecond) // longer than the idle timeout
	if state := p.connectionState(); state != "connected" {
		t.Errorf("connection state after the idle timeout = %q, want connected", state)
	}
	if n := len(p.socketURLs()); n != opened {
		t.Errorf("the page opened %d sockets while it followed its thread, want none", n-opened)
	}
	if f := p.followFrames(); len(f) != 1 || !strings.HasPrefix(f[0], "follow thread-") {
		t.Errorf("follow frames sent = %q, want one follow of the page's thread", f)
	}

	p.setOptions(demoOptions{Tokens: "60", IntervalMs: "50"}) // 3 s: longer than the idle timeout
	p.send("wake up")
	got := p.waitStatus(0, "done")
	if want := tokensReply(60); got.Reply != want {
		t.Errorf("reply = %q, want %q", got.Reply, want)
	}
	if n := len(p.socketURLs()); n != opened {
		t.Errorf("the page opened %d sockets for the turn, want none", n-opened)
	}
}

// TestWebRejoinUnknownRun reloads a page whose stored thread (also in its address) names a
// running turn the gateway does not know (its log expired, or it never started): the rejoin
// is refused (4404) and the page shows the error on that turn instead of waiting for ever;
// the conversation goes on.
func TestWebRejoinUnknownRun(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")
	eval[chromedp.Void](p, `sessionStorage.setItem("wsgateway.thread", JSON.stringify({
		threadId: "thread-e2e",
		turns: [{ runId: "run-never-started", user: { id: "msg-1", content: "lost" }, blocks: [], status: "running", notes: [] }],
	})); history.replaceState(null, "", "#thread=thread-e2e")`)
	p.do(chromedp.Reload())
	p.waitReady()
	got := p.waitStatus(0, "error")
	if got.RunID != "run-never-started" || got.User != "lost" {
		t.Errorf("turn after the reload = runId %q, user %q; want run-never-started, lost", got.RunID, got.User)
	}
	if !strings.Contains(got.StatusLine, "unknown or expired run") || got.Busy != "false" {
		t.Errorf("status line = %q (aria-busy %q), want the 4404 reason and not busy", got.StatusLine, got.Busy)
	}
	p.send("next")
	if got := p.waitStatus(1, "done"); got.Reply != "You said: next" {
		t.Errorf("reply after the refused rejoin = %q, want %q", got.Reply, "You said: next")
	}
}

// TestWebScreenshots renders a conversation in the light and the dark theme (the system
// preference, then the toggle) and checks the themes differ as they should. With
// -update-screenshots it writes them to docs/ for the README.
func TestWebScreenshots(t *testing.T) {
	g := startGateway(t)
	p := openPage(t, startBrowser(t), g.URL+"/")

	p.setOptions(demoOptions{ToolCall: true, Reasoning: true, IntervalMs: "0"})
	p.send("What's the weather in Paris?")
	p.waitStatus(0, "done")
	p.setOptions(demoOptions{IntervalMs: "0"})
	p.send("Reload the page while a reply streams: it picks up where it left off.")
	p.waitStatus(1, "done")
	p.do(chromedp.Click(chromedp.CSS("#conversation .turn [data-role=reasoning] summary")))
	if !eval[bool](p, `document.querySelector("#conversation [data-role=reasoning]").open`) {
		t.Error("clicking the reasoning summary did not open it")
	}

	// What a visitor would try next: a long reply to reload in the middle of.
	p.setOptions(demoOptions{Tokens: "300", IntervalMs: "50", ToolCall: true})
	background := func() string {
		return eval[string](p, `getComputedStyle(document.documentElement).backgroundColor`)
	}
	themes := []struct {
		scheme, file string
		wantDark     bool
	}{
		{"light", "screenshot-light.png", false},
		{"dark", "screenshot-dark.png", true},
	}
	shots := map[string][]byte{}
	backgrounds := map[string]string{}
	for _, th := range themes {
		p.emulateColorScheme(th.scheme)
		p.do(chromedp.Blur(chromedp.CSS("#prompt"))) // no focus ring in the picture
		if got := eval[bool](p, `document.querySelector("#theme-toggle").getAttribute("aria-pressed") === "true"`); got != th.wantDark {
			t.Errorf("%s scheme: theme toggle aria-pressed = %v, want %v", th.scheme, got, th.wantDark)
		}
		backgrounds[th.scheme] = background()
		img, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot (%s): %v", th.scheme, err)
		}
		if _, err := png.Decode(bytes.NewReader(img)); err != nil {
			t.Fatalf("screenshot (%s) is not a PNG: %v", th.scheme, err)
		}
		shots[th.file] = img
	}
	if backgrounds["light"] == backgrounds["dark"] {
		t.Errorf("light and dark backgrounds are both %s", backgrounds["light"])
	}
	if got := backgrounds["dark"]; got != "rgb(15, 18, 23)" {
		t.Errorf("dark background = %s, want rgb(15, 18, 23)", got)
	}
	// The toggle overrides the system preference, and the choice survives a reload.
	p.do(chromedp.Click(chromedp.CSS("#theme-toggle")))
	if got := background(); got != backgrounds["light"] {
		t.Errorf("after the toggle in a dark system: background %s, want the light %s", got, backgrounds["light"])
	}
	p.do(chromedp.Reload())
	p.waitReady()
	if got := background(); got != backgrounds["light"] {
		t.Errorf("after a reload the toggled theme is lost: background %s, want %s", got, backgrounds["light"])
	}

	if !*updateScreenshots {
		return
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for name, img := range shots {
		path := filepath.Join(root, "docs", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, img, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
	}
}
