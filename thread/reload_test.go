package thread_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/thread"
)

// reloadCase is one line of testdata/npm/tanstack-reload.mjs.
type reloadCase struct {
	ID      string            `json:"id"`
	Hydrate json.RawMessage   `json:"hydrate,omitempty"`
	Replay  []json.RawMessage `json:"replay,omitempty"`
	// PageSize and Pages (answers by the before cursor, "" for none) page instead.
	PageSize int            `json:"pageSize,omitempty"`
	Pages    map[string]any `json:"pages,omitempty"`
}

type reloadResult struct {
	ID       string          `json:"id"`
	Messages json.RawMessage `json:"messages"`
	Joined   int             `json:"joined"`
	Calls    int             `json:"calls"`
	Error    string          `json:"error"`
}

// runReload runs the cases through the real ChatClient, in one Node process.
func runReload(t *testing.T, cases []reloadCase) []reloadResult {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js 20 or later) is not on PATH: %v; install it, then run `npm ci` in testdata/npm", err)
	}
	dir := filepath.Join(testenv.MustModuleRoot(t), "testdata", "npm")
	for _, need := range []string{"tanstack-reload.mjs", "node_modules/@tanstack/ai-client/package.json"} {
		if _, err := os.Stat(filepath.Join(dir, need)); err != nil {
			t.Fatalf("%s is missing (%v): run `npm ci` in testdata/npm", need, err)
		}
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, c := range cases {
		if err := enc.Encode(c); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(node, "tanstack-reload.mjs")
	cmd.Dir, cmd.Stdin = dir, &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node tanstack-reload.mjs: %v; stderr:\n%s", err, stderr.Bytes())
	}
	var results []reloadResult
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var r reloadResult
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("decode the client's answer: %v", err)
		}
		if r.Error != "" {
			t.Fatalf("the client failed on %s: %s", r.ID, r.Error)
		}
		results = append(results, r)
	}
	if len(results) != len(cases) {
		t.Fatalf("the client answered %d cases, want %d", len(results), len(cases))
	}
	return results
}

// TestReload checks rules 1 and 2 against the real ChatClient: a client that
// reloads while a run is active hydrates what Active answers after any prefix
// of the run's log, rejoins the run and replays its log from the start, and
// must end with the messages Finish builds from the whole log. Every run of
// the hand-written threads is reloaded at every event but its terminal, and
// the demo agent's threads (TestDemoAgent) at every third, except
// threads whose replies start with reasoning before TEXT_MESSAGE_START (rule
// 3: the client does not rebuild those) and the agent loop ending with
// finishReason "tool_calls" (the client's rejoin does not finalize such a
// run, its live path does).
func TestReload(t *testing.T) {
	skip := map[string]bool{
		"reasoning before TEXT_MESSAGE_START": true,
		"steps and signatures":                true,
		"agent loop, finishReason tool_calls": true,
	}
	var ths []refThread
	for _, th := range threads() {
		if !skip[th.ID] {
			ths = append(ths, th)
		}
	}
	// The demo agent's shapes but those that start with reasoning, at every
	// third event.
	n := len(ths)
	for _, th := range demoThreads(t) {
		if !strings.Contains(th.ID, `"reasoning":true`) {
			ths = append(ths, th)
		}
	}
	refs := runReference(t, ths)
	var cases []reloadCase
	var want []string
	for i, th := range ths {
		every := 1
		if i >= n {
			every = 3
		}
		var tr thread.Transcript
		for j, r := range th.Runs {
			if err := tr.Accept(r.RunID, refs[i].Inputs[j]); err != nil {
				t.Fatal(err)
			}
			final := copyTranscript(t, tr)
			if err := final.Finish(r.RunID, r.Events); err != nil {
				t.Fatal(err)
			}
			for k := 1; k < len(r.Events); k++ {
				if k%every != 0 && k != len(r.Events)-1 {
					continue
				}
				answer := map[string]any{
					"messages":   tr.Active(r.RunID, r.Events[:k]),
					"activeRun":  map[string]string{"runId": r.RunID},
					"interrupts": tr.Interrupts,
					"page":       map[string]bool{"truncated": false},
				}
				cases = append(cases, reloadCase{ID: th.ID + "/" + r.RunID + "/" + strconv.Itoa(k), Hydrate: mustJSON(t, answer), Replay: r.Events})
				want = append(want, normalise(t, mustJSON(t, final.Messages), isMinted))
			}
			tr = final
		}
	}
	results := runReload(t, cases)
	for i, r := range results {
		if r.Joined != 1 {
			t.Errorf("%s: the client joined the run %d times, want once", cases[i].ID, r.Joined)
		}
		if got := normalise(t, r.Messages, isMinted); got != want[i] {
			t.Errorf("%s: after the reload the client shows %s\nhydrated: %s", cases[i].ID, firstDiff(want[i], got), cases[i].Hydrate)
		}
	}
	t.Logf("builder: %d reloads mid-run end with the messages Finish builds", len(cases))
}

// isMinted matches the ids either side mints (a hydrated client keeps the
// server's).
func isMinted(s string) bool { return isServerID(s) || isClientID(s) }

func copyTranscript(t *testing.T, tr thread.Transcript) thread.Transcript {
	t.Helper()
	var c thread.Transcript
	if err := json.Unmarshal(mustJSON(t, tr), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPageClient pages transcripts through the real ChatClient (history.pageSize):
// it hydrates the newest page, then loads older pages by the cursors Page issues
// until none remains, and must end with the whole transcript, in order, having
// asked once per page (an empty older page would fail the client's load).
func TestPageClient(t *testing.T) {
	var cases []reloadCase
	var want []string
	var pages []int
	for _, n := range []int{0, 1, 2, 5, 12} {
		msgs := make([]thread.Message, n)
		for i := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs[i] = thread.Message{ID: "m" + strconv.Itoa(i), Role: role, Parts: []thread.Part{{Type: "text", Content: "text " + strconv.Itoa(i)}}}
		}
		for _, size := range []int{1, 2, 5, 13} {
			answers := map[string]any{}
			before, count := "", 0
			for {
				window, cursor := thread.Page(msgs, size, before)
				page := map[string]any{"truncated": false}
				if cursor != "" {
					page = map[string]any{"truncated": true, "cursor": cursor}
				}
				answers[before] = map[string]any{"messages": window, "activeRun": nil, "interrupts": nil, "page": page}
				count++
				if cursor == "" {
					break
				}
				before = cursor
			}
			c := reloadCase{ID: strconv.Itoa(n) + " messages, pages of " + strconv.Itoa(size), PageSize: size, Pages: answers}
			cases = append(cases, c)
			want = append(want, normalise(t, mustJSON(t, msgs), isMinted))
			pages = append(pages, count)
		}
	}
	results := runReload(t, cases)
	for i, r := range results {
		if got := normalise(t, r.Messages, isMinted); got != want[i] {
			t.Errorf("%s: the client shows %s", cases[i].ID, firstDiff(want[i], got))
		}
		if r.Calls != pages[i] {
			t.Errorf("%s: the client asked %d times, want once per page (%d)", cases[i].ID, r.Calls, pages[i])
		}
	}
}
