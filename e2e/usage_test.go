package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// tokensMetric returns wsgateway_agent_tokens_total of the demo agent for kind.
func tokensMetric(tb testing.TB, ctx context.Context, gw *gateway, kind string) int64 {
	tb.Helper()
	return int64(metricSample(tb, ctx, gw, `wsgateway_agent_tokens_total{agent="demo",kind="`+kind+`",model="none"}`))
}

// runUsage reads a socket until the last of its turn's runs terminal ends (or stopAfter
// envelopes, when not 0) and returns the usage its RUN_FINISHED events reported, and the
// offset of the last envelope.
func runUsage(tb testing.TB, ctx context.Context, c *websocket.Conn, runs, stopAfter int) (in, out, total int64, offset string) {
	tb.Helper()
	n, ended := 0, 0
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			tb.Fatalf("read: %v", err)
		}
		var f struct {
			ID    string `json:"id"`
			Chunk struct {
				Type  string `json:"type"`
				Usage []struct {
					In    int64 `json:"inputTokens"`
					Out   int64 `json:"outputTokens"`
					Total int64 `json:"totalTokens"`
				} `json:"usage"`
			} `json:"chunk"`
		}
		if json.Unmarshal(data, &f) != nil || f.ID == "" {
			continue
		}
		n++
		offset = f.ID
		for _, u := range f.Chunk.Usage {
			in, out, total = in+u.In, out+u.Out, total+u.Total
		}
		if f.Chunk.Type == "RUN_FINISHED" || f.Chunk.Type == "RUN_ERROR" {
			ended++
		}
		if ended == runs || n == stopAfter {
			return
		}
	}
}

// TestUsageCountedOncePerRun sends turns whose agent reports a usage to two gateways on one
// NATS; one of them is resumed three times while it streams (twice on the other gateway)
// and joined twice once it ended. The gateways' token counters, and the usage ledger that
// GET /api/usage reads on either gateway, equal the sum of the usage the runs reported:
// each run counted once, by its thread.
func TestUsageCountedOncePerRun(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wantIn, wantOut, wantTotal int64
	threads := map[string]int64{} // total tokens by thread

	// The resumed and joined turn: three resume sockets opened while it streams, each read
	// to its end.
	c := dialTurn(t, ctx, gw, "usage-0", `{"tokens":40,"intervalMs":10,"usage":true}`)
	_, _, _, offset := runUsage(t, ctx, c, 1, 5)
	c.CloseNow()
	for i, g := range []*gateway{gw, other, other} {
		r, err := dialWS(ctx, resumeURL(g, "usage-0", offset))
		if err != nil {
			t.Fatal(err)
		}
		var in, out, total int64
		if i < 2 {
			_, _, _, offset = runUsage(t, ctx, r, 1, 5)
		} else {
			in, out, total, _ = runUsage(t, ctx, r, 1, 0)
			wantIn, wantOut, wantTotal = in, out, total
		}
		r.CloseNow()
	}
	if wantOut != 40 || wantIn != 1 || wantTotal != 41 {
		t.Fatalf("usage-0 reported in %d out %d total %d, want 1, 40, 41", wantIn, wantOut, wantTotal)
	}
	threads["t"] = wantTotal
	for _, g := range []*gateway{gw, other} {
		joinLog(t, ctx, g, "usage-0")
	}
	// More runs: an agent loop of three runs on the other gateway in another thread, and a
	// plain turn.
	for i, turn := range []struct {
		gw           *gateway
		thread, opts string
		runs         int
	}{{other, "t2", `{"tokens":7,"intervalMs":0,"runs":3,"usage":true}`, 3}, {gw, "t", `{"intervalMs":0,"usage":true}`, 1}} {
		c := dialThreadTurn(t, ctx, turn.gw, turn.thread, fmt.Sprintf("usage-%d", i+1), turn.opts)
		in, out, total, _ := runUsage(t, ctx, c, turn.runs, 0)
		c.CloseNow()
		wantIn, wantOut, wantTotal = wantIn+in, wantOut+out, wantTotal+total
		threads[turn.thread] += total
	}
	// The counters are added once the terminal is stored, before it is delivered; a join
	// of the last run makes sure of it too.
	joinLog(t, ctx, gw, "usage-2")
	for kind, want := range map[string]int64{"input": wantIn, "output": wantOut, "total": wantTotal} {
		if got := tokensMetric(t, ctx, gw, kind) + tokensMetric(t, ctx, other, kind); got != want {
			t.Errorf("wsgateway_agent_tokens_total{kind=%q} = %d, want %d (the sum of the runs' usage)", kind, got, want)
		}
	}
	// The ledger records a run in the background once its terminal is stored: wait for the
	// three runs, then read again, from both gateways.
	deadline := time.Now().Add(30 * time.Second)
	for getUsage(t, ctx, gw).Runs < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a run counted twice would show by now
	for _, g := range []*gateway{gw, other} {
		rep := getUsage(t, ctx, g)
		if rep.In != wantIn || rep.Out != wantOut || rep.Total != wantTotal || rep.Runs != 3 {
			t.Errorf("GET /api/usage = in %d out %d total %d in %d runs, want %d, %d, %d in 3 runs (each run once)",
				rep.In, rep.Out, rep.Total, rep.Runs, wantIn, wantOut, wantTotal)
		}
		got := map[string]int64{}
		for _, th := range rep.Threads {
			got[th.ThreadID] = th.Total
		}
		if len(got) != 2 || got["t"] != threads["t"] || got["t2"] != threads["t2"] {
			t.Errorf("GET /api/usage by thread = %v, want %v", got, threads)
		}
	}
}

// dialThreadTurn opens a conversation socket and sends one run frame of thread for the demo
// agent.
func dialThreadTurn(tb testing.TB, ctx context.Context, gw *gateway, thread, runID, demoOpts string) *websocket.Conn {
	tb.Helper()
	c, _, err := websocket.Dial(ctx, gw.WS, nil)
	if err != nil {
		tb.Fatalf("dial %s: %v", gw.WS, err)
	}
	tb.Cleanup(func() { c.CloseNow() })
	frame := `{"threadId":"` + thread + `","runId":"` + runID + `","messages":[{"id":"u","role":"user","content":"hi"}],"forwardedProps":{"demo":` + demoOpts + `}}`
	if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		tb.Fatalf("write run frame: %v", err)
	}
	return c
}

// usageReport is the answer of GET /api/usage.
type usageReport struct {
	In      int64 `json:"inputTokens"`
	Out     int64 `json:"outputTokens"`
	Total   int64 `json:"totalTokens"`
	Runs    int64 `json:"runs"`
	Threads []struct {
		ThreadID string `json:"threadId"`
		Total    int64  `json:"totalTokens"`
	} `json:"threads"`
}

// getUsage GETs the gateway's /api/usage of the current period.
func getUsage(tb testing.TB, ctx context.Context, gw *gateway) usageReport {
	tb.Helper()
	status, body, err := httpGet(ctx, gw.URL+"/api/usage")
	if err != nil || status != 200 {
		tb.Fatalf("GET /api/usage = %d %s, %v", status, body, err)
	}
	var r usageReport
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		tb.Fatalf("GET /api/usage: %v: %s", err, body)
	}
	return r
}

// TestTokenBudgetClaim runs a gateway with --auth jwt and a token budget: a principal whose
// token's wsgateway_token_budget claim gives it 30 tokens a period is refused, RUN_ERROR
// budget_exceeded, once a turn used them, and served again the next period; a principal
// whose token has no claim keeps --token-budget; each one's GET /api/usage shows its own
// runs and budget only.
func TestTokenBudgetClaim(t *testing.T) {
	key, pemFile := newJWTKey(t)
	const period = 6 * time.Second
	gw := startGateway(t, "--auth", "jwt", "--jwt-key-file", pemFile, "--token-budget", "1000", "--token-budget-period", period.String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	token := func(sub string, budget any) string {
		c := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
		if budget != nil {
			c["wsgateway_token_budget"] = budget
		}
		return signToken(t, jwt.SigningMethodES256, key, c)
	}
	alice, bob := token("alice", 30), token("bob", nil)
	turn := func(tok, runID string) []wire {
		c, _, err := websocket.Dial(ctx, gw.WS, &websocket.DialOptions{HTTPHeader: bearer(tok)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, runID, `{"tokens":40,"intervalMs":0,"usage":true}`, "hi")); err != nil {
			t.Fatal(err)
		}
		return readTurn(t, ctx, c)
	}
	report := func(tok string) (r struct {
		usageReport
		Budget *struct{ Tokens, Used int64 }
	}) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw.URL+"/api/usage", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/usage = %d", resp.StatusCode)
		}
		json.NewDecoder(resp.Body).Decode(&r)
		return r
	}
	last := func(ws []wire) string { return ws[len(ws)-1].String() }

	// From the start of a period, so that the spending turn and the refusal fall in one.
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period)))
	if got := last(turn(alice, "a-1")); got != "envelope RUN_FINISHED" {
		t.Fatalf("alice's first turn ended %s", got)
	}
	for report(alice).Runs < 1 {
		time.Sleep(20 * time.Millisecond)
	}
	if r := report(alice); r.Budget == nil || r.Budget.Tokens != 30 || r.Budget.Used != 41 || r.Total != 41 {
		t.Errorf("alice's report = %+v, want a budget of 30 (her claim), 41 used", r)
	}
	refused := turn(alice, "a-2")
	if got := typesOfWire(refused); got != "CUSTOM RUN_ERROR:budget_exceeded" {
		t.Errorf("alice's second turn = %s, want run.accepted then RUN_ERROR budget_exceeded", rawOf(refused))
	}
	if got := last(turn(bob, "b-1")); got != "envelope RUN_FINISHED" {
		t.Errorf("bob's turn (the flag's budget of 1000) ended %s", got)
	}
	for report(bob).Runs < 1 {
		time.Sleep(20 * time.Millisecond)
	}
	if r := report(bob); r.Runs != 1 || r.Total != 41 || r.Budget == nil || r.Budget.Tokens != 1000 {
		t.Errorf("bob's report = %+v, want his one run and a budget of 1000", r)
	}
	// The next period.
	for report(alice).Budget.Used != 0 {
		time.Sleep(50 * time.Millisecond)
	}
	if got := last(turn(alice, "a-3")); got != "envelope RUN_FINISHED" {
		t.Errorf("alice's turn in the next period ended %s", got)
	}
}
