package conversation_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/protocol"
)

// branchPage is a hydrate's answer as a page with branches reads it.
type branchPage struct {
	Messages []struct {
		ID    string `json:"id"`
		Role  string `json:"role"`
		Parts []struct {
			Content string `json:"content"`
		} `json:"parts"`
		Metadata struct {
			Branch *struct{ Index, Count int } `json:"branch"`
		} `json:"metadata"`
	} `json:"messages"`
}

// summary writes the page as "role text [i/n] | …".
func (p branchPage) summary() string {
	var b strings.Builder
	for _, m := range p.Messages {
		b.WriteString(m.Role)
		for _, part := range m.Parts {
			b.WriteString(" " + part.Content)
		}
		if br := m.Metadata.Branch; br != nil {
			b.WriteString(" [" + itoa(br.Index) + "/" + itoa(br.Count) + "]")
		}
		b.WriteString(" | ")
	}
	return b.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

func decodePage(t *testing.T, resp *http.Response) branchPage {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var p branchPage
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return p
}

// TestBranchesAcrossGateways (THREADS.md section 7): two gateways, one thread. A regenerate
// twice gives three sibling replies, each answered from the thread up to the message it
// regenerates; a hydrate on the other gateway shows the newest with metadata.branch 3 of 3;
// POST /api/threads/T/branch on one gateway switches to the first for every device (its answer
// and the other gateway's hydrate show it, 1 of 3), a follower on the other gateway gets
// thread.branch, and the next turn's agent answers from the branch shown. Bad switches are
// refused: an unknown message or thread (404), a body without messageId (400), a run active
// on the thread (409).
func TestBranchesAcrossGateways(t *testing.T) {
	model := newChatModel(t)
	model.slow["slow"] = 3 * time.Second
	a := newEnv(t, envOptions{agent: model.agent()})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), agent: model.agent()})

	ca := dial(t, a.url(), "")
	ca.send(userFrame("r1", "u1", "user", "hello"))
	ca.untilTerminal()
	// The client's regenerate: the list up to the message answered again.
	for _, run := range []string{"r2", "r3"} {
		ca.send(userFrame(run, "u1", "user", "hello"))
		ca.untilTerminal()
	}
	for n := 1; n <= 3; n++ {
		sameMessages(t, "regenerate "+itoa(n), model.request(n), "user: hello")
	}
	h := decodePage(t, b.httpDo(t, http.MethodGet, "/api/chat", nil, nil, "threadId", "T"))
	if got, want := h.summary(), "user hello | assistant answer 3 [3/3] | "; got != want {
		t.Fatalf("hydrate after two regenerates: %s, want %s", got, want)
	}
	first := decodeIDs(t, a, "r1")[0]

	follower := dial(t, b.url(), "")
	follower.send(followFrame("follow", "T"))
	time.Sleep(200 * time.Millisecond) // the follow is subscribed

	p := decodePage(t, a.httpDo(t, http.MethodPost, "/api/threads/T/branch", []byte(`{"messageId":"`+first+`"}`), nil))
	if got, want := p.summary(), "user hello | assistant answer 1 [1/3] | "; got != want {
		t.Fatalf("the switch's answer: %s, want %s", got, want)
	}
	f := follower.next(10 * time.Second)
	var ev struct {
		Type, Name string
		Value      struct{ MessageID, ThreadID string }
	}
	json.Unmarshal(f.Event, &ev)
	if f.Kind != protocol.FrameEvent || ev.Name != protocol.ThreadBranchName || ev.Value.MessageID != first || ev.Value.ThreadID != "T" {
		t.Fatalf("the follower got %s, want a thread.branch frame naming %s", f.raw, first)
	}
	h = decodePage(t, b.httpDo(t, http.MethodGet, "/api/chat", nil, nil, "threadId", "T"))
	if got, want := h.summary(), "user hello | assistant answer 1 [1/3] | "; got != want {
		t.Fatalf("hydrate on the other gateway after the switch: %s, want %s", got, want)
	}

	cb := dial(t, b.url(), "")
	cb.send(userFrame("r4", "u2", "user", "and then?"))
	cb.untilTerminal()
	sameMessages(t, "the turn after the switch", model.request(4), "user: hello", "assistant: answer 1", "user: and then?")

	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/api/threads/T/branch", `{"messageId":"nope"}`, http.StatusNotFound},
		{"/api/threads/nope/branch", `{"messageId":"u1"}`, http.StatusNotFound},
		{"/api/threads/T/branch", `{"id":"u1"}`, http.StatusBadRequest},
		{"/api/threads/T/branch", `not json`, http.StatusBadRequest},
	} {
		resp := a.httpDo(t, http.MethodPost, c.path, []byte(c.body), nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.status || !strings.Contains(string(body), `"error"`) {
			t.Errorf("POST %s %s = %d %s, want %d with an error", c.path, c.body, resp.StatusCode, body, c.status)
		}
	}
	ca.send(userFrame("r5", "u3", "user", "slow"))
	ca.next(10 * time.Second) // run.accepted: the thread holds r5
	resp := b.httpDo(t, http.MethodPost, "/api/threads/T/branch", []byte(`{"messageId":"u1"}`), nil)
	body, _ := io.ReadAll(resp.Body)
	if want := `{"error":"thread_busy","activeRun":{"runId":"r5"}}` + "\n"; resp.StatusCode != http.StatusConflict || string(body) != want {
		t.Errorf("a switch while r5 runs = %d %s, want 409 %s", resp.StatusCode, body, want)
	}
	ca.untilTerminal()
}

// decodeIDs returns the ids of the assistant messages of run runID's log, read from its
// start on e.
func decodeIDs(t *testing.T, e *env, runID string) []string {
	t.Helper()
	var ids []string
	for _, f := range e.open(t, "/api/chat", http.MethodGet, nil, nil, "runId", runID, "offset", "-1").all() {
		var m struct{ Type, MessageID string }
		if json.Unmarshal(f.Event, &m) == nil && m.Type == "TEXT_MESSAGE_START" {
			ids = append(ids, m.MessageID)
		}
	}
	if len(ids) == 0 {
		t.Fatalf("run %s has no assistant message", runID)
	}
	return ids
}
