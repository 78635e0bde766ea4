package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromiumPath is Debian's chromium, the browser the page tests drive.
const chromiumPath = "/usr/bin/chromium"

// Bounds of the browser tests.
const (
	browserTimeout = 90 * time.Second // one test's whole browser session
	pageTimeout    = 30 * time.Second // one wait for the page to reach a state
	pollInterval   = 20 * time.Millisecond
)

// startBrowser starts a headless chromium with a fresh profile in a temporary directory and
// returns its context; the browser is closed (and its process reaped) when the test ends.
// A machine without chromium fails the test, naming the package that fixes it.
func startBrowser(tb testing.TB) context.Context {
	tb.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		tb.Fatalf("%s is missing: the page tests drive Debian's chromium; install it (apt-get install chromium), or run scripts/test as root: %v", chromiumPath, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.WindowSize(1280, 860),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	tb.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the process to exit
	})
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("start %s: %v", chromiumPath, err)
	}
	return ctx
}

// page is one browser tab on the chat page.
type page struct {
	tb  testing.TB
	ctx context.Context

	mu         sync.Mutex
	exceptions []string
	sockets    []string          // URLs of the WebSockets the page opened, in order
	sent       []json.RawMessage // text frames the page sent, in order
}

// openPage opens a tab of browser on url and waits until the page is ready for input. An
// uncaught exception in the page fails the test.
func openPage(tb testing.TB, browser context.Context, url string) *page {
	tb.Helper()
	tab, cancelTab := chromedp.NewContext(browser)
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	tb.Cleanup(func() {
		cancel()
		cancelTab()
	})
	p := &page{tb: tb, ctx: ctx}
	if err := chromedp.Listen(tab, p.onEvent); err != nil {
		tb.Fatalf("listen to the tab: %v", err)
	}
	tb.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.exceptions {
			tb.Errorf("uncaught exception in the page: %s", e)
		}
	})
	p.do(chromedp.EmulateViewport(1280, 860), chromedp.Navigate(url))
	p.waitReady()
	return p
}

func (p *page) onEvent(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventWebSocketCreated:
		p.sockets = append(p.sockets, ev.URL)
	case *network.EventWebSocketFrameSent:
		if ev.Response != nil && ev.Response.Opcode == 1 {
			p.sent = append(p.sent, json.RawMessage(bytes.Clone(ev.Response.PayloadData)))
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		text := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			text = d.Exception.Description
		}
		p.exceptions = append(p.exceptions, fmt.Sprintf("%s (%s:%d:%d)", text, d.URL, d.LineNumber+1, d.ColumnNumber+1))
	}
}

// socketURLs returns the URLs of the WebSockets the page has opened so far.
func (p *page) socketURLs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sockets)
}

// runFrame is the part of a RunAgentInput the tests look at.
type runFrame struct {
	Type        string `json:"type"` // "abort", "follow", "unfollow"; "" for a run frame
	ThreadID    string `json:"threadId"`
	RunID       string `json:"runId"`
	ParentRunID string `json:"parentRunId"`
	Resume      []struct {
		InterruptID string `json:"interruptId"`
		Status      string `json:"status"`
		Payload     struct {
			Approved *bool `json:"approved"`
		} `json:"payload"`
	} `json:"resume"`
	Messages []struct {
		ID         string          `json:"id"`
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"toolCallId"`
	} `json:"messages"`
	Tools          json.RawMessage `json:"tools"`
	Context        json.RawMessage `json:"context"`
	ForwardedProps struct {
		Demo map[string]any `json:"demo"`
	} `json:"forwardedProps"`
	MultitaskStrategy string `json:"multitaskStrategy"`
}

// sentFrames returns the run and abort frames the page has sent so far, decoded (follow
// frames: followFrames).
func (p *page) sentFrames() []runFrame {
	p.tb.Helper()
	var out []runFrame
	for _, f := range p.allFrames() {
		if f.Type != "follow" && f.Type != "unfollow" {
			out = append(out, f)
		}
	}
	return out
}

// followFrames returns the follow and unfollow frames the page has sent so far, as
// "follow <threadId>".
func (p *page) followFrames() []string {
	p.tb.Helper()
	var out []string
	for _, f := range p.allFrames() {
		if f.Type == "follow" || f.Type == "unfollow" {
			out = append(out, f.Type+" "+f.ThreadID)
		}
	}
	return out
}

// allFrames returns every text frame the page has sent so far, decoded.
func (p *page) allFrames() []runFrame {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]runFrame, len(p.sent))
	for i, raw := range p.sent {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			p.tb.Fatalf("the page sent a frame that is not a JSON object: %s", raw)
		}
	}
	return out
}

// do runs browser actions, failing the test on an error.
func (p *page) do(actions ...chromedp.Action[chromedp.Void]) {
	p.tb.Helper()
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.tb.Fatalf("browser: %v\n%s", err, p.describe())
	}
}

// eval evaluates a JavaScript expression and decodes its value into T.
func eval[T any](p *page, expr string) T {
	p.tb.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.tb.Fatalf("evaluate %s: %v\n%s", expr, err, p.describe())
	}
	return v
}

// waitReady waits until the page's modules have run: the connection state left "offline"
// and the composer has focus.
func (p *page) waitReady() {
	p.tb.Helper()
	p.waitFor("the page to start", `document.querySelector("#connection").dataset.state !== "offline" && document.activeElement === document.querySelector("#prompt")`)
}

// waitFor polls the JavaScript condition cond until it is true; after pageTimeout it fails
// the test with what the page shows. Errors while the page reloads count as false.
func (p *page) waitFor(what, cond string) {
	p.tb.Helper()
	deadline := time.Now().Add(pageTimeout)
	for {
		ok, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`Boolean(`+cond+`)`))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) || p.ctx.Err() != nil {
			p.tb.Fatalf("timed out waiting for %s (last error: %v)\n%s", what, err, p.describe())
		}
		time.Sleep(pollInterval)
	}
}

// turnState is what the page shows of one turn.
type turnState struct {
	RunID     string   `json:"runId"`
	Status    string   `json:"status"`
	User      string   `json:"user"`
	Reply     string   `json:"reply"`
	Texts     int      `json:"texts"`
	Reasoning []string `json:"reasoning"`
	Tools     []struct {
		Name   string `json:"name"`
		Args   string `json:"args"`
		Result string `json:"result"`
	} `json:"tools"`
	StatusLine string `json:"statusLine"`
	Note       string `json:"note"`
	Busy       string `json:"busy"`
	// Approval is "" (nothing to approve), "pending" (the Approve and Deny buttons enabled) or
	// the answer shown once they are disabled.
	Approval string `json:"approval"`
}

const turnsJS = `Array.from(document.querySelectorAll("#conversation .turn"), (t) => ({
	runId: t.dataset.runId,
	status: t.dataset.status,
	user: t.querySelector("[data-role=user] .bubble").textContent,
	reply: Array.from(t.querySelectorAll("[data-role=assistant-text]"), (e) => e.textContent).join(""),
	texts: t.querySelectorAll("[data-role=assistant-text]").length,
	reasoning: Array.from(t.querySelectorAll("[data-role=reasoning] .reasoning-text"), (e) => e.textContent),
	tools: Array.from(t.querySelectorAll("[data-role=tool-call]"), (e) => ({
		name: e.querySelector(".tool-name").textContent,
		args: e.querySelector("[data-role=tool-args]").textContent,
		result: e.querySelector("[data-role=tool-result]").textContent,
	})),
	statusLine: t.querySelector("[data-role=status]").hidden ? "" : t.querySelector("[data-role=status]").textContent,
	note: t.querySelector("[data-role=note]").hidden ? "" : t.querySelector("[data-role=note]").textContent,
	busy: t.querySelector("[data-role=reply]").getAttribute("aria-busy"),
	approval: ((a) => !a ? "" : !a.querySelector("[data-role=approve]").disabled && !a.querySelector("[data-role=deny]").disabled ? "pending" :
		a.querySelector("[data-role=approval-answer]").textContent)(t.querySelector("[data-role=approval]")),
}))`

// turns returns what the page shows of every turn, in order.
func (p *page) turns() []turnState {
	p.tb.Helper()
	return eval[[]turnState](p, turnsJS)
}

// turn returns turn i (from 0), failing the test when the page shows fewer.
func (p *page) turn(i int) turnState {
	p.tb.Helper()
	ts := p.turns()
	if i >= len(ts) {
		p.tb.Fatalf("the page shows %d turns, want at least %d\n%s", len(ts), i+1, p.describe())
	}
	return ts[i]
}

// waitStatus waits until turn i shows status.
func (p *page) waitStatus(i int, status string) turnState {
	p.tb.Helper()
	p.waitFor(fmt.Sprintf("turn %d to be %s", i, status),
		fmt.Sprintf(`document.querySelectorAll("#conversation .turn")[%d]?.dataset.status === %q`, i, status))
	return p.turn(i)
}

// waitReplyLen waits until the reply of turn i has at least n characters.
func (p *page) waitReplyLen(i, n int) {
	p.tb.Helper()
	p.waitFor(fmt.Sprintf("turn %d's reply to reach %d characters", i, n), fmt.Sprintf(
		`Array.from(document.querySelectorAll("#conversation .turn")[%d]?.querySelectorAll("[data-role=assistant-text]") ?? [], (e) => e.textContent).join("").length >= %d`, i, n))
}

// connectionState returns the connection state the page shows.
func (p *page) connectionState() string {
	p.tb.Helper()
	return eval[string](p, `document.querySelector("#connection").dataset.state`)
}

// demoOptions fills the options panel as a visitor would.
type demoOptions struct {
	Tokens, IntervalMs            string // "" leaves the agent's default
	ToolCall, Reasoning, Approval bool
}

func (p *page) setOptions(o demoOptions) {
	p.tb.Helper()
	p.do(
		chromedp.SetValue(chromedp.CSS("#opt-tokens"), o.Tokens),
		chromedp.SetValue(chromedp.CSS("#opt-interval"), o.IntervalMs),
	)
	for sel, want := range map[string]bool{"#opt-tool": o.ToolCall, "#opt-reasoning": o.Reasoning, "#opt-approval": o.Approval} {
		if eval[bool](p, fmt.Sprintf(`document.querySelector(%q).checked`, sel)) != want {
			p.do(chromedp.Click(chromedp.CSS(sel)))
		}
	}
}

// send waits until no reply of the page streams, then types text into the composer and
// presses Enter, as a visitor would.
func (p *page) send(text string) {
	p.tb.Helper()
	p.waitFor("the page's replies to end", `document.body.dataset.busy !== "true"`)
	p.sendNow(text)
}

// sendNow types text into the composer and presses Enter at once, a reply streaming or not.
func (p *page) sendNow(text string) {
	p.tb.Helper()
	p.do(chromedp.SendKeys(chromedp.CSS("#prompt"), text+"\r"))
}

// recordStates starts recording, in the page, every connection state it shows from now on;
// states returns them in order (each change is one mutation record, however fast they come).
func (p *page) recordStates() {
	p.tb.Helper()
	eval[chromedp.Void](p, `(() => {
		const el = document.querySelector("#connection");
		window.shownStates = [];
		window.stateObserver = new MutationObserver((records) => {
			for (const r of records) window.shownStates.push(r.oldValue);
		});
		window.stateObserver.observe(el, { attributes: true, attributeFilter: ["data-state"], attributeOldValue: true });
	})()`)
}

func (p *page) states() []string {
	p.tb.Helper()
	return eval[[]string](p, `[...window.shownStates, ...window.stateObserver.takeRecords().map((r) => r.oldValue), document.querySelector("#connection").dataset.state]`)
}

// emulateColorScheme makes the page see prefers-color-scheme: scheme.
func (p *page) emulateColorScheme(scheme string) {
	p.tb.Helper()
	p.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return err
	}))
}

// describe returns what the page shows, for failure messages.
func (p *page) describe() string {
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[json.RawMessage](`({
		connection: document.querySelector("#connection")?.dataset.state,
		storage: sessionStorage.getItem("wsgateway.thread")?.slice(0, 2000),
		turns: `+turnsJS+`,
	})`))
	if err != nil {
		return fmt.Sprintf("(page state unavailable: %v)", err)
	}
	s := string(v)
	if len(s) > 6000 {
		s = s[:6000] + "…"
	}
	return "page: " + strings.TrimSpace(s)
}
