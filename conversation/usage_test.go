package conversation_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/threadstore"
	"github.com/wsgateway/wsgateway/usage"
)

// TestBudgetEveryDoor: once a principal used its token budget of the period, a run started
// by any door (socket, SSE, /agui, POST /api/threads/{id}/runs) ends RUN_ERROR code
// budget_exceeded without its agent being called, its thread records it, the refusals are
// counted, and the next period's budget lets the principal send again. Another principal is
// not refused.
func TestBudgetEveryDoor(t *testing.T) {
	const period = 6 * time.Second
	e := newEnv(t, envOptions{usage: &usage.Config{Period: period, Budget: 10}})
	// From the start of a period, so that the spending run and the refusals fall in one.
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period)))
	c := dial(t, e.url(), "")
	c.send(threadFrame("T", "spend", script{Tokens: 1, Usage: 20}, "u1", "hello"))
	if got := summary(c.untilTerminal()); got != tokenTurn(1) {
		t.Fatalf("the first turn: %s", got)
	}
	testenv.WaitFor(t, 30*time.Second, "p1 over its budget", func() bool { return e.ledger.Exceeded("p1") })

	const refused = "CUSTOM:run.accepted RUN_ERROR:budget_exceeded"
	c.send(threadFrame("T", "by-socket", script{Tokens: 1}, "u2", "again"))
	if got := summary(c.untilTerminal()); got != refused {
		t.Errorf("socket: %s, want %s", got, refused)
	}
	if got := summary(e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "by-sse", script{Tokens: 1}, "u3", "again"), nil).all()); got != refused {
		t.Errorf("SSE: %s, want %s", got, refused)
	}
	if got := summary(e.open(t, "/agui", http.MethodPost, threadFrame("T", "by-agui", script{Tokens: 1}, "u4", "again"), nil).all()); got != "RUN_ERROR:budget_exceeded" {
		t.Errorf("/agui: %s, want RUN_ERROR:budget_exceeded", got)
	}
	resp, err := http.Post(e.http.URL+"/api/threads/T/runs", "application/json",
		strings.NewReader(`{"messages":[{"id":"u5","role":"user","content":"again"}],"forwardedProps":{"test":{"tokens":1}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var started struct{ RunID string }
	json.NewDecoder(resp.Body).Decode(&started)
	resp.Body.Close()
	if log, _ := e.resume(t, started.RunID, "-1"); summary(log) != refused {
		t.Errorf("POST /api/threads/T/runs: %s, want %s", summary(log), refused)
	}
	if got := e.metric(t, "wsgateway_conversation_limit_refusals_total", "token_budget"); got != 4 {
		t.Errorf("refusals{limit=token_budget} = %v, want 4", got)
	}
	// The thread records how each refused run ended, once each run's finish lands (after
	// its log's close, which the clients above saw).
	var runs []threadstore.ThreadRun
	recorded := func() bool {
		th, err := e.threads.Thread(context.Background(), "p1", "T")
		if err != nil {
			t.Fatal(err)
		}
		runs = th.Runs
		codes := map[string]string{}
		for _, r := range th.Runs {
			codes[r.RunID] = r.Code
		}
		for _, id := range []string{"by-socket", "by-sse", "by-agui", started.RunID} {
			if codes[id] != conversation.CodeBudgetExceeded {
				return false
			}
		}
		return true
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("thread T's runs: %+v", runs)
		}
	})
	testenv.WaitFor(t, 10*time.Second, "thread T's refused runs all recorded budget_exceeded", recorded)
	// Another principal has a budget of its own.
	other := dial(t, e.url(), "p2")
	other.send(threadFrame("T", "p2-run", script{Tokens: 1}, "u1", "hello"))
	if got := summary(other.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("p2's turn: %s", got)
	}

	testenv.WaitFor(t, 30*time.Second, "p1's budget renewed by the next period", func() bool { return !e.ledger.Exceeded("p1") })
	c.send(threadFrame("T", "next-period", script{Tokens: 1}, "u6", "again"))
	if got := summary(c.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("the next period's turn: %s, want %s", got, tokenTurn(1))
	}
}

// getUsage GETs /api/usage as principal with the raw query q.
func (e *env) getUsage(t *testing.T, principal, q string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.http.URL+"/api/usage?"+q, nil)
	req.Header.Set("X-Principal", principal)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestUsageReport: GET /api/usage answers the caller's principal's usage only, with the
// totals and breakdowns of its runs, and 400 with a clear error for bad input.
func TestUsageReport(t *testing.T) {
	e := newEnv(t, envOptions{usage: &usage.Config{}})
	for _, turn := range []struct {
		principal, thread, runID string
		usage                    int
	}{{"alice", "A", "a1", 10}, {"alice", "B", "a2", 20}, {"bob", "A", "b1", 300}} {
		c := dial(t, e.url(), turn.principal)
		c.send(threadFrame(turn.thread, turn.runID, script{Tokens: 1, Usage: turn.usage}, "u1", "hello"))
		c.untilTerminal()
	}
	type counts struct{ InputTokens, OutputTokens, TotalTokens, Runs int64 }
	var alice struct {
		counts
		From, To time.Time
		Threads  []struct {
			ThreadID string
			counts
		}
		Models []struct {
			Model string
			counts
		}
	}
	testenv.WaitFor(t, 30*time.Second, "alice's two runs in her report", func() bool {
		status, body := e.getUsage(t, "alice", "")
		if status != http.StatusOK {
			t.Fatalf("GET /api/usage = %d %s", status, body)
		}
		json.Unmarshal([]byte(body), &alice)
		return alice.Runs == 2
	})
	if alice.counts != (counts{2, 30, 32, 2}) || len(alice.Threads) != 2 || len(alice.Models) != 1 ||
		alice.Threads[0].ThreadID != "B" || alice.Threads[0].counts != (counts{1, 20, 21, 1}) ||
		alice.Models[0].Model != "m-test" || alice.Models[0].counts != alice.counts {
		t.Errorf("alice's report = %+v, want her two runs only", alice)
	}
	if !alice.From.Equal(time.Now().UTC().Truncate(24*time.Hour)) || alice.To.Sub(alice.From) != 24*time.Hour {
		t.Errorf("the default range is %v to %v, want today (UTC)", alice.From, alice.To)
	}
	for q, want := range map[string]string{
		"from=yesterday": `{"error":"from: not an RFC 3339 time (such as 2026-12-01T00:00:00Z): yesterday"}`,
		"to=2026-12-01":  `{"error":"to: not an RFC 3339 time (such as 2026-12-01T00:00:00Z): 2026-12-01"}`,
		"from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z":   `{"error":"usage: invalid range: to must be after from"}`,
		"from=2000-01-01T00:00:00Z&to=2026-01-01T00:00:00Z":   `{"error":"usage: invalid range: the range spans`,
		"from=2026-12-01T00:00:00Z&from=2026-12-02T00:00:00Z": `{"error":"from: given more than once"}`,
	} {
		status, body := e.getUsage(t, "alice", q)
		if status != http.StatusBadRequest || !strings.HasPrefix(body, strings.TrimSuffix(want, `"}`)) {
			t.Errorf("GET /api/usage?%s = %d %s, want 400 %s", q, status, body, want)
		}
	}
	if status, body := e.getUsage(t, "carol", "from=2026-01-01T00:00:00Z&to=2027-01-01T00:00:00Z"); status != http.StatusOK ||
		!strings.Contains(body, `"inputTokens":0,"outputTokens":0,"totalTokens":0,"runs":0,"threads":[],"models":[]`) {
		t.Errorf("carol's report = %d %s, want nothing", status, body)
	}
}

// TestUsageOfResubmit: a runId sent again while its turn runs (a resubmit) aborts that turn
// and runs the agent again: both turns' usage counts, each once.
func TestUsageOfResubmit(t *testing.T) {
	e := newEnv(t, envOptions{usage: &usage.Config{}})
	c := dial(t, e.url(), "")
	// An agent loop whose first run finishes, with its usage, while its second one streams.
	c.send(threadFrame("T", "r", script{Tokens: 200, IntervalMs: 5, Runs: 2, Usage: 5}, "u1", "hello"))
	for f := c.next(20 * time.Second); f.Type != "RUN_FINISHED"; f = c.next(20 * time.Second) {
		if f.err != nil {
			t.Fatalf("socket ended before the first run finished: %v", f.err)
		}
	}
	c.send(threadFrame("T", "r", script{Tokens: 1, Usage: 7}, "u1", "hello"))
	for f := c.next(20 * time.Second); f.Type != "CUSTOM"; f = c.next(20 * time.Second) {
		if f.err != nil {
			t.Fatalf("socket ended before the resubmit's turn: %v", f.err)
		}
	}
	if got := summary(c.untilTerminal()); got != strings.TrimPrefix(tokenTurn(1), "CUSTOM:run.accepted ") {
		t.Fatalf("the resubmit's turn: %s", got)
	}
	type counts struct{ InputTokens, OutputTokens, TotalTokens, Runs int64 }
	var got counts
	testenv.WaitFor(t, 30*time.Second, "both turns in the report", func() bool {
		_, body := e.getUsage(t, "p1", "")
		json.Unmarshal([]byte(body), &got)
		return got.Runs >= 2
	})
	if got != (counts{2, 12, 14, 2}) {
		t.Errorf("report = %+v, want both turns once each: in 2, out 12, total 14, 2 runs", got)
	}
}
