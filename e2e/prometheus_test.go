package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// Debian's prometheus package (scripts/test installs it): the server and promtool.
const (
	prometheusBin = "/usr/bin/prometheus"
	promtoolBin   = "/usr/bin/promtool"
	alertTests    = "deploy/prometheus/alerts_test.yml"
)

// TestAlertRules checks the alert rules with promtool and runs their unit tests.
func TestAlertRules(t *testing.T) {
	root := testenv.MustModuleRoot(t)
	for _, args := range [][]string{
		{"check", "rules", filepath.Join(root, alertsFile)},
		{"test", "rules", filepath.Join(root, alertTests)},
	} {
		out, err := exec.Command(promtoolBin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
	}
	// Every alert has a unit test.
	b, err := os.ReadFile(filepath.Join(root, alertTests))
	if err != nil {
		t.Fatal(err)
	}
	for where := range ruleExprs(t, root) {
		name := strings.TrimPrefix(where, "alert ")
		if !strings.Contains(string(b), "alertname: "+name+"\n") {
			t.Errorf("%s: no test of alert %s", alertTests, name)
		}
	}
}

// TestDashboardQueriesReturnData starts a real Prometheus that scrapes a gateway every second
// while turns stream, resumes replay and a limit refuses, then runs every query of the
// dashboard: each returns at least one sample that is a number (a panel that can never show
// anything is a defect).
func TestDashboardQueriesReturnData(t *testing.T) {
	root := testenv.MustModuleRoot(t)
	gw := startGateway(t, "--run-frame-rate", "2", "--run-frame-burst", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ln := testenv.Listen(t)
	promAddr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: wsgateway
    static_configs:
      - targets: [%q]
`, gw.Addr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := exec.Command(prometheusBin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr)
	var plog testenv.LockedBuffer
	prom.Stdout, prom.Stderr = &plog, &plog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		prom.Process.Kill()
		prom.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", plog.String())
		}
	})

	// Once Prometheus scrapes the gateway, a short load: turns (some with a tool call),
	// resumes, refused run frames.
	base := "http://" + promAddr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if n, _, err := promQuery(ctx, base, `up{job="wsgateway"} == 1`); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Prometheus did not scrape the gateway within 30 s")
		}
	}
	for i := range 12 {
		runID := fmt.Sprintf("prom-%d", i)
		opts := `{"tokens":20,"intervalMs":5,"usage":true}`
		if i%2 == 1 {
			opts = `{"tokens":5,"intervalMs":5,"toolCall":true,"usage":true}`
		}
		c := dialTurn(t, ctx, gw, runID, opts)
		readUntilTerminal(t, ctx, c)
		joinLog(t, ctx, gw, runID)
		time.Sleep(300 * time.Millisecond)
	}
	c := dialTurn(t, ctx, gw, "prom-burst-1", `{"tokens":1}`)
	for i := range 3 {
		frame := fmt.Sprintf(`{"threadId":"t","runId":"prom-burst-%d","messages":[{"id":"u","role":"user","content":"hi"}]}`, i+2)
		c.Write(ctx, 1, []byte(frame))
	}
	time.Sleep(500 * time.Millisecond)
	c.CloseNow()

	// The queries run within a minute of the load, over a window of a minute; each may wait
	// for the scrape after the load.
	exprs := dashboardExprs(t, root)
	for where, es := range exprs {
		for _, e := range es {
			q := strings.ReplaceAll(e, "$__rate_interval", "1m")
			var last string
			for deadline := time.Now().Add(5 * time.Second); ; {
				n, desc, err := promQuery(ctx, base, q)
				if err == nil && n > 0 {
					break
				}
				last = desc
				if err != nil {
					last = err.Error()
				}
				if time.Now().After(deadline) {
					t.Errorf("%s: %s: %q returns no data: %s", dashboardFile, where, q, last)
					break
				}
				time.Sleep(time.Second)
			}
		}
	}
	t.Logf("%d panels' queries return data", len(exprs))
}

// promQuery runs an instant query and returns how many of its samples are numbers.
func promQuery(ctx context.Context, base, q string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, "", err
	}
	if r.Status != "success" {
		return 0, "", fmt.Errorf("query failed: %s", r.Error)
	}
	n := 0
	var vals []string
	for _, s := range r.Data.Result {
		v, _ := s.Value[1].(string)
		vals = append(vals, v)
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) {
			n++
		}
	}
	return n, fmt.Sprintf("%d samples %v", len(r.Data.Result), vals), nil
}
