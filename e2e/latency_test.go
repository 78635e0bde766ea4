package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// metricSample returns the value of one series on gw's /metrics, named as the text format
// writes it (`name{label="value",…}`, labels in order).
func metricSample(tb testing.TB, ctx context.Context, gw *gateway, series string) float64 {
	tb.Helper()
	status, body, err := httpGet(ctx, gw.URL+"/metrics")
	if err != nil || status != 200 {
		tb.Fatalf("GET /metrics = %d, %v", status, err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		tb.Fatalf("/metrics has no %s", series)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// gatewayTTFTSum returns the sum of the gateway's time-to-first-token histogram, in seconds.
func gatewayTTFTSum(tb testing.TB, ctx context.Context, gw *gateway) float64 {
	tb.Helper()
	return metricSample(tb, ctx, gw, `wsgateway_agent_time_to_first_token_seconds_sum{agent="demo",model="none"}`)
}

// TestTimeToFirstTokenAgreesWithClient sends turns one after the other and compares, turn by
// turn, the time to first token the gateway observed (the growth of its histogram's sum) with
// the one the client measured (run frame written → first TEXT_MESSAGE_CONTENT read): their
// medians agree within 5 ms on loopback, and the histogram carries an exemplar naming a run.
func TestTimeToFirstTokenAgreesWithClient(t *testing.T) {
	gw := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const turns = 21
	var client, server []float64
	var runIDs []string
	prev := gatewayTTFTSum(t, ctx, gw)
	for i := range turns {
		runID := fmt.Sprintf("ttft-%d", i)
		runIDs = append(runIDs, runID)
		c, err := dialWS(ctx, gw.WS)
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		if err := c.Write(ctx, websocket.MessageText, demoRunFrame(runID, `{"tokens":3,"intervalMs":10}`)); err != nil {
			t.Fatal(err)
		}
		es, _, err := readFrames(ctx, c, contentCount(1))
		if err != nil {
			t.Fatalf("turn %d: %v after %v", i, err, es)
		}
		client = append(client, time.Since(sent).Seconds())
		if es, _, err = readFrames(ctx, c, turnEnded); err != nil {
			t.Fatalf("turn %d: %v after %v", i, err, es)
		}
		c.Close(websocket.StatusNormalClosure, "")
		// The histogram is observed once the terminal is stored, just before the end is
		// delivered: wait for it.
		var sum float64
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if sum = gatewayTTFTSum(t, ctx, gw); sum != prev || time.Now().After(deadline) {
				break
			}
		}
		if sum == prev {
			t.Fatalf("turn %d: the gateway's time to first token was not observed", i)
		}
		server = append(server, sum-prev)
		prev = sum
	}
	median := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mc, ms := median(client), median(server)
	t.Logf("time to first token, median of %d turns: client %.2f ms, gateway %.2f ms", turns, mc*1e3, ms*1e3)
	if d := mc - ms; d > 0.005 || d < -0.005 {
		t.Errorf("medians differ by %.2f ms, want within 5 ms: client %v, gateway %v", d*1e3, client, server)
	}
	if ms <= 0 || ms > mc+0.005 {
		t.Errorf("gateway median %.2f ms, want positive and not past the client's", ms*1e3)
	}

	// OpenMetrics shows the exemplar of the last observations: a run_id of these turns.
	body := getOpenMetrics(t, ctx, gw)
	ex := regexp.MustCompile(`(?m)^wsgateway_agent_time_to_first_token_seconds_bucket\{[^}]*\} \S+ # \{run_id="([^"]+)"\} (\S+)`).FindAllStringSubmatch(body, -1)
	if len(ex) == 0 {
		t.Fatalf("no exemplar on the time-to-first-token histogram in:\n%s", grepLines(body, "wsgateway_agent_"))
	}
	for _, m := range ex {
		if !slices.Contains(runIDs, m[1]) {
			t.Errorf("exemplar run_id %q is not a run of the test", m[1])
		}
	}
	for _, name := range []string{"inter_token_seconds", "tokens_per_second", "turn_duration_seconds"} {
		if !regexp.MustCompile(`(?m)^wsgateway_agent_` + name + `_bucket\{[^}]*\} \S+ # \{run_id="ttft-`).MatchString(body) {
			t.Errorf("no exemplar on wsgateway_agent_%s in:\n%s", name, grepLines(body, "wsgateway_agent_"+name))
		}
	}
}

// getOpenMetrics reads /metrics in the OpenMetrics format, where exemplars show.
func getOpenMetrics(tb testing.TB, ctx context.Context, gw *gateway) string {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", gw.URL+"/metrics", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		tb.Fatalf("GET /metrics with Accept OpenMetrics: Content-Type %q", ct)
	}
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}
