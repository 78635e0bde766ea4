package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// nodeTimeout bounds one Node script run; the scripts also stop themselves earlier.
const nodeTimeout = 60 * time.Second

// npmDir returns testdata/npm, failing the test with the fix when node or the npm packages are
// missing: these tests must never be skipped silently.
func npmDir(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		tb.Fatal("node is not installed: these tests run the real npm clients in Node 20 or later (install nodejs)")
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(root, "testdata", "npm")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@tanstack", "ai-client", "package.json")); err != nil {
		tb.Fatalf("testdata/npm/node_modules is missing: run (cd testdata/npm && npm ci) or scripts/test (%v)", err)
	}
	return dir
}

// runNode runs `node <script> args...` in testdata/npm. Each stdout line is a JSON object; a line
// with a "progress" key is passed to onProgress (which may be nil) as soon as it is printed, and
// the "result" of the last line is decoded into result. A failing script fails the test with its
// stderr.
func runNode(tb testing.TB, script string, onProgress func(json.RawMessage), result any, args ...string) {
	tb.Helper()
	dir := npmDir(tb)
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("node %s: %v", script, err)
	}
	var last json.RawMessage
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var line struct {
			Progress json.RawMessage `json:"progress"`
			Result   json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			tb.Errorf("node %s printed a line that is not JSON: %q", script, sc.Text())
			continue
		}
		switch {
		case line.Progress != nil:
			if onProgress != nil {
				onProgress(line.Progress)
			}
		case line.Result != nil:
			last = line.Result
		}
	}
	if err := cmd.Wait(); err != nil {
		tb.Fatalf("node %s %q: %v\n%s", script, args, err, stderr.Bytes())
	}
	if last == nil {
		tb.Fatalf("node %s printed no result\n%s", script, stderr.Bytes())
	}
	if err := json.Unmarshal(last, result); err != nil {
		tb.Fatalf("node %s: decoding result: %v\n%s", script, err, last)
	}
}
