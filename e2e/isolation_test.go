package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestRunIsolationAcrossGateways: two gateways on one NATS, JWT authentication. While alice's
// turn runs (longer than two lease renewals), mallory sends, with its runId and on both
// gateways, again and again, a run frame, a resume from one of its offsets, a join, a tail, an
// abort, an HTTP POST and an HTTP GET. Each is refused (forbidden, 4404, 404) and alice's turn
// completes: its log is byte for byte the log of the same turn nobody disturbed (the runId
// masked). The same at generation 2, after alice resubmits the runId.
func TestRunIsolationAcrossGateways(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key, pemFile := newJWTKey(t)
	flags := []string{"--auth", "jwt", "--jwt-key-file", pemFile, "--jwt-audience", secAudience, "--jwt-issuer", secIssuer,
		"--lease-ttl", "3s"}
	a := &secGateway{gateway: startGateway(t, flags...), key: key, pemFile: pemFile}
	b := &secGateway{gateway: startGateway(t, append(flags, "--nats-url", a.NATSURL)...), key: key, pemFile: pemFile}
	gws := []*secGateway{a, b}

	const demo = `{"tokens":120,"intervalMs":40}` // about 5s: past two renewals (every 1s) and the TTL
	undisturbed := func(runID string) []string {
		c := a.dialAs(t, ctx, "alice", "")
		if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, runID, demo, "hello")); err != nil {
			t.Fatal(err)
		}
		readTurn(t, ctx, c)
		return maskedEvents(t, a.logOf(t, ctx, "alice", runID), runID)
	}
	want := undisturbed("calm")

	const victim = "victim"
	for gen, owner := range []*secGateway{a, b} { // generation 2: the resubmit goes through the other gateway
		c := owner.dialAs(t, ctx, "alice", "")
		if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, victim, demo, "hello")); err != nil {
			t.Fatal(err)
		}
		first := readWire(t, ctx, c)
		if first.Name != "run.accepted" {
			t.Fatalf("gen %d: alice's first frame %v, want run.accepted", gen+1, first)
		}
		done := make(chan []wire, 1)
		go func() { done <- readTurn(t, ctx, c) }()
		for round := range 3 {
			for _, g := range gws {
				for _, got := range mallory(t, ctx, g, victim, first.Offset) {
					if !got.ok {
						t.Errorf("gen %d, round %d, gateway %s: mallory's %s answered %s", gen+1, round, g.Addr, got.what, got.answer)
					}
				}
			}
			time.Sleep(time.Second)
		}
		rest := <-done
		if last := rest[len(rest)-1]; last.Type != "RUN_FINISHED" {
			t.Fatalf("gen %d: alice's turn ended with %v (%s) while mallory tried its runId, want RUN_FINISHED", gen+1, last, last.Message)
		}
		for _, g := range gws {
			got := maskedEvents(t, g.logOf(t, ctx, "alice", victim), victim)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("gen %d: alice's log read on %s differs from the undisturbed turn's:\n%s\nwant\n%s", gen+1, g.Addr, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	}
}

// createdAtField is a reply start's createdAt (the demo agent's clock at its emit).
var createdAtField = regexp.MustCompile(`"createdAt":"[^"]*"`)

// maskedEvents returns the events of envelopes (their chunks, byte for byte) with runID and
// createdAt replaced, so that two runs of the same demo turn compare equal.
func maskedEvents(tb testing.TB, ws []wire, runID string) []string {
	tb.Helper()
	var out []string
	for _, w := range ws {
		var f struct {
			Chunk json.RawMessage `json:"chunk"`
		}
		if err := json.Unmarshal([]byte(w.Raw), &f); err != nil || f.Chunk == nil {
			tb.Fatalf("envelope %q: %v", w.Raw, err)
		}
		chunk := createdAtField.ReplaceAllString(string(f.Chunk), `"createdAt":"<createdAt>"`)
		out = append(out, strings.ReplaceAll(chunk, runID, "<runId>"))
	}
	return out
}

// attempt is one of mallory's tries and how the gateway answered it.
type attempt struct {
	what, answer string
	ok           bool
}

// mallory tries every way into runID on g, as another principal, and reports the answers.
func mallory(tb testing.TB, ctx context.Context, g *secGateway, runID, offset string) []attempt {
	tb.Helper()
	var out []attempt
	add := func(what, answer, want string) {
		out = append(out, attempt{what, answer, strings.HasPrefix(answer, want)})
	}
	c := g.dialAs(tb, ctx, "mallory", "")
	if err := c.Write(ctx, websocket.MessageText, runFrameJSON(tb, runID, `{"tokens":1}`, "mine now")); err != nil {
		tb.Fatal(err)
	}
	add("run frame", readWire(tb, ctx, c).String(), "RUN_ERROR forbidden")
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"abort","runId":"`+runID+`"}`)); err != nil {
		tb.Fatal(err)
	}
	add("abort", "sent", "sent")
	c.CloseNow()
	for _, off := range []string{offset, "-1", "now"} {
		_, end := g.joinAs(tb, ctx, "mallory", runID, off)
		add("resume from "+off, end.String(), "close 4404")
	}
	tok := g.token(tb, "mallory", nil)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/api/chat/ndjson",
		bytes.NewReader(runFrameJSON(tb, runID, `{"tokens":1}`, "mine now")))
	req.Header = bearer(tok)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := httpClient.Do(req); err != nil {
		add("HTTP POST", err.Error(), "forbidden")
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer := fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		want := answer
		if !strings.Contains(answer, `"code":"forbidden"`) {
			want = "a stream of one RUN_ERROR forbidden"
		}
		add("HTTP POST", answer, want)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/api/chat/ndjson?runId="+url.QueryEscape(runID)+"&offset=-1", nil)
	req.Header = bearer(tok)
	if resp, err := httpClient.Do(req); err != nil {
		add("HTTP GET", err.Error(), "404")
	} else {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		add("HTTP GET", fmt.Sprint(resp.StatusCode), "404")
	}
	return out
}
