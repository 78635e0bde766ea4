package thread_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// refThread is one line the reference (testdata/npm/tanstack-builder.mjs) reads.
type refThread struct {
	ID   string   `json:"id"`
	Runs []refRun `json:"runs"`
}

type refRun struct {
	RunID    string            `json:"runId"`
	ThreadID string            `json:"threadId,omitempty"`
	Before   []refOp           `json:"before,omitempty"`
	Events   []json.RawMessage `json:"events"`
}

// refOp is a call ChatClient makes on its processor between runs.
type refOp struct {
	Op         string          `json:"op"` // user | approve | toolResult | truncate
	ID         string          `json:"id,omitempty"`
	Content    string          `json:"content,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"` // of a user message
	ApprovalID string          `json:"approvalId,omitempty"`
	Approved   *bool           `json:"approved,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	// InterruptID is the client-tool interrupt a toolResult answers.
	InterruptID string `json:"interruptId,omitempty"`
}

type refResult struct {
	ID       string            `json:"id"`
	Inputs   []json.RawMessage `json:"inputs"`
	Messages json.RawMessage   `json:"messages"`
	Model    json.RawMessage   `json:"model"` // convertMessagesToModelMessages(messages)
	Error    string            `json:"error"`
}

// runReference runs the threads through the real StreamProcessor, in one Node
// process, and returns one result per thread in order. It fails the test (never
// skips) when node or the npm packages are missing.
func runReference(t *testing.T, threads []refThread) []refResult {
	t.Helper()
	return startReference(t, threads)()
}

// startReference starts runReference's Node process and returns at once; the
// function it returns waits for the results. The test may work meanwhile.
func startReference(t *testing.T, threads []refThread) func() []refResult {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js 20 or later) is not on PATH: %v; install it, then run `npm ci` in testdata/npm", err)
	}
	dir := filepath.Join(testenv.MustModuleRoot(t), "testdata", "npm")
	for _, need := range []string{"tanstack-builder.mjs", "node_modules/@tanstack/ai/package.json"} {
		if _, err := os.Stat(filepath.Join(dir, need)); err != nil {
			t.Fatalf("%s is missing (%v): run `npm ci` in testdata/npm", need, err)
		}
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, th := range threads {
		if err := enc.Encode(th); err != nil {
			t.Fatalf("encode %s: %v", th.ID, err)
		}
	}
	cmd := exec.Command(node, "tanstack-builder.mjs")
	cmd.Dir = dir
	cmd.Stdin = &in
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node tanstack-builder.mjs: %v", err)
	}
	return func() []refResult {
		t.Helper()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("node tanstack-builder.mjs: %v; stderr:\n%s", err, stderr.Bytes())
		}
		var results []refResult
		dec := json.NewDecoder(&out)
		for dec.More() {
			var r refResult
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("decode the reference's answer: %v", err)
			}
			results = append(results, r)
		}
		if len(results) != len(threads) {
			t.Fatalf("the reference answered %d threads, want %d", len(results), len(threads))
		}
		for i, r := range results {
			if r.ID != threads[i].ID {
				t.Fatalf("the reference answered %q for thread %q", r.ID, threads[i].ID)
			}
			if r.Error != "" {
				t.Fatalf("the reference failed on %s: %s", r.ID, r.Error)
			}
		}
		return results
	}
}

// Ids the client mints at random (generateMessageId) and the ones the builder
// mints from the run id.
var (
	clientID = regexp.MustCompile(`^msg-[0-9]+-[0-9a-z]*$`)
	serverID = regexp.MustCompile(`^[a-z][a-z0-9]*-[as][0-9]+$`)
)

// normalise returns messages (JSON) for comparison: createdAt removed, and
// every minted id (matched by minted) replaced by "#n", n counting distinct
// ids in order of first appearance in a walk that visits object keys sorted.
// Two transcripts that agree up to the names of minted ids normalise to the
// same text.
func normalise(t testing.TB, messages []byte, minted func(string) bool) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(messages, &v); err != nil {
		t.Fatalf("decode messages: %v: %s", err, messages)
	}
	list, _ := v.([]any)
	for _, m := range list {
		if o, ok := m.(map[string]any); ok {
			delete(o, "createdAt")
		}
	}
	names := map[string]string{}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			if !minted(x) {
				return x
			}
			if n, ok := names[x]; ok {
				return n
			}
			names[x] = "#" + strconv.Itoa(len(names)+1)
			return names[x]
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				x[k] = walk(x[k])
			}
		}
		return v
	}
	b, err := json.Marshal(walk(v))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-120, 0)
	return fmt.Sprintf("at byte %d:\n  server: …%s\n  client: …%s", i, a[from:min(i+120, len(a))], b[from:min(i+120, len(b))])
}
