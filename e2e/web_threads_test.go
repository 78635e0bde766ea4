package e2e

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// TestWebThreadFromList: a browser with a new profile lists the thread another browser wrote,
// and opening it shows every turn as the writer's page shows it (the reply, reasoning, tool
// call), and so does a third opened on the writer's address; deleting it empties the list.
func TestWebThreadFromList(t *testing.T) {
	g := startGateway(t)
	writer := openPage(t, startBrowser(t), g.URL+"/")
	writer.setOptions(demoOptions{Tokens: "3", IntervalMs: "0"})
	writer.send("first question")
	writer.waitStatus(0, "done")
	writer.setOptions(demoOptions{Tokens: "4", IntervalMs: "0", ToolCall: true, Reasoning: true})
	writer.send("second question")
	writer.waitStatus(1, "done")
	want := writer.turns()

	reader := openPage(t, startBrowser(t), g.URL+"/")
	reader.waitFor("the thread in the list", `document.querySelector("#thread-list .thread-open")?.textContent === "first question"`)
	if n := eval[int](reader, `document.querySelectorAll("#thread-list li").length`); n != 1 {
		t.Fatalf("the list shows %d threads, want 1", n)
	}
	reader.do(chromedp.Click(chromedp.CSS("#thread-list .thread-open")))
	reader.waitFor("both turns", `document.querySelectorAll("#conversation .turn").length === 2`)
	got := reader.turns()
	for i := range want {
		w, g := want[i], got[i]
		w.RunID, g.RunID, w.Note, g.Note = "", "", "", ""
		if w.User != g.User || w.Reply != g.Reply || w.Status != g.Status || len(w.Reasoning) != len(g.Reasoning) ||
			len(w.Tools) != len(g.Tools) || (len(w.Reasoning) > 0 && w.Reasoning[0] != g.Reasoning[0]) ||
			(len(w.Tools) > 0 && (w.Tools[0].Name != g.Tools[0].Name || w.Tools[0].Args != g.Tools[0].Args)) {
			t.Errorf("turn %d from the list:\n%+v\nthe writer's page:\n%+v", i, g, w)
		}
	}

	// A third browser given the writer's address shows the thread as the server keeps it.
	addressed := openPage(t, startBrowser(t), g.URL+"/"+eval[string](writer, `location.hash`))
	addressed.waitFor("both turns from the address", `document.querySelectorAll("#conversation .turn").length === 2`)
	for i, g := range addressed.turns() {
		if w := want[i]; g.User != w.User || g.Reply != w.Reply || g.Status != w.Status {
			t.Errorf("turn %d opened from the address:\n%+v\nthe writer's page:\n%+v", i, g, w)
		}
	}

	reader.do(chromedp.Click(chromedp.CSS("#thread-list .thread-delete")))
	reader.waitFor("an empty list", `document.querySelectorAll("#thread-list li").length === 0`)
	if n := len(reader.turns()); n != 0 {
		t.Errorf("the page shows %d turns after the delete, want a new empty chat", n)
	}
}
