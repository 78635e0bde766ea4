package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// conformanceTests is how many tests @durable-streams/server-conformance-tests 0.3.6 runs by
// default (338, less the 6 of the reserved subscription APIs, off unless asked for).
const conformanceTests = 332

// conformanceLongPoll is the gateways' --durable-long-poll in the conformance runs: the suite
// waits at most 5 s for a long-poll's 204.
const conformanceLongPoll = time.Second

// TestDurableConformance runs the Durable Streams conformance suite (testdata/durable) against
// one gateway, then against two gateways on one NATS behind a proxy that sends every request
// to the other gateway than the previous one.
func TestDurableConformance(t *testing.T) {
	dir := durableDir(t)
	lp := "--durable-long-poll=" + conformanceLongPoll.String()
	t.Run("one gateway", func(t *testing.T) {
		gw := startGateway(t, lp)
		runConformance(t, dir, gw.URL)
	})
	t.Run("two gateways round-robin", func(t *testing.T) {
		a := startGateway(t, lp)
		b := startGateway(t, lp, "--nats-url", a.NATSURL)
		runConformance(t, dir, roundRobin(t, a.URL, b.URL))
	})
}

// durableDir returns testdata/durable, failing the test with the fix when node or its npm
// packages are missing.
func durableDir(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		tb.Fatal("node is not installed: the conformance suite runs in Node 20 or later (install nodejs)")
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(root, "testdata", "durable")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@durable-streams", "server-conformance-tests", "package.json")); err != nil {
		tb.Fatalf("testdata/durable/node_modules is missing: run (cd testdata/durable && npm ci) or scripts/test (%v)", err)
	}
	return dir
}

// roundRobin starts an HTTP proxy that sends each request to the next of targets in turn,
// streaming responses (SSE) as they come, and returns its URL.
func roundRobin(tb testing.TB, targets ...string) string {
	tb.Helper()
	var urls []*url.URL
	for _, s := range targets {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		urls = append(urls, u)
	}
	var n atomic.Uint64
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(urls[(n.Add(1)-1)%uint64(len(urls))])
			r.Out.Host = r.In.Host
		},
		Transport:     tr,
		FlushInterval: -1,
		// A client going away mid-request (the suite aborts SSE reads) is not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv := httptest.NewUnstartedServer(proxy)
	srv.Listener.Close()
	srv.Listener = testenv.Listen(tb) // the suite's fetch refuses bad ports
	srv.Start()
	tb.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		tr.CloseIdleConnections()
	})
	return srv.URL
}

// vitestReport is the part of vitest's JSON report the test reads.
type vitestReport struct {
	NumTotalTests   int `json:"numTotalTests"`
	NumPassedTests  int `json:"numPassedTests"`
	NumFailedTests  int `json:"numFailedTests"`
	NumPendingTests int `json:"numPendingTests"`
	NumTodoTests    int `json:"numTodoTests"`
	TestResults     []struct {
		AssertionResults []struct {
			FullName        string   `json:"fullName"`
			Status          string   `json:"status"`
			FailureMessages []string `json:"failureMessages"`
		} `json:"assertionResults"`
	} `json:"testResults"`
}

// runConformance runs the suite through its one-line test file against baseURL and fails on
// any failure or on fewer passes than conformanceTests.
func runConformance(t *testing.T, dir, baseURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	report := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.CommandContext(ctx, "node", "node_modules/vitest/vitest.mjs", "run",
		// vitest's 5 s per test is short for the suite's byte-by-byte checks of 100 KiB
		// bodies on a busy 2-core machine; 30 s still ends a hung test.
		"--reporter=json", "--outputFile="+report, "--testTimeout=30000", "conformance.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DS_BASE_URL="+baseURL,
		"DS_LONG_POLL_MS="+strconv.FormatInt(conformanceLongPoll.Milliseconds(), 10), "NO_COLOR=1", "CI=1")
	out, runErr := cmd.CombinedOutput()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("vitest wrote no report (%v): %v\n%s", runErr, err, tail(string(out), 40))
	}
	var r vitestReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("vitest report: %v", err)
	}
	skipped := r.NumPendingTests + r.NumTodoTests
	t.Logf("conformance against %s: %d passed, %d failed, %d skipped (of %d)", baseURL,
		r.NumPassedTests, r.NumFailedTests, skipped, r.NumTotalTests)
	for _, f := range r.TestResults {
		for _, a := range f.AssertionResults {
			if a.Status == "failed" {
				msg := ""
				if len(a.FailureMessages) > 0 {
					msg = tail(a.FailureMessages[0], 6)
				}
				t.Errorf("failed: %s\n%s", a.FullName, msg)
			}
		}
	}
	if r.NumFailedTests > 0 || r.NumPassedTests < conformanceTests {
		t.Fatalf("conformance: %d passed, %d failed, want %d passed (vitest: %v)", r.NumPassedTests,
			r.NumFailedTests, conformanceTests, runErr)
	}
}
