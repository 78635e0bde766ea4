package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Faults of the scale-out topology (startTopology: three NATS processes, two gateways, the
// flags of docker-compose.yml): each test drives real clients and checks what they assemble
// against the demo agent's exact turn and against the run's log.

// testLeaseTTL is the gateways' lease TTL in the fault tests, short to keep them quick.
const testLeaseTTL = 5 * time.Second

// follower is a client following one run: it reads a socket until it ends, then resumes
// through another socket from the last offset it received, as the reference client does.
type follower struct {
	runID  string
	got    []envelope
	drops  int // sockets that ended without a close 1000
	status websocket.StatusCode
}

// last returns the offset to resume after.
func (f *follower) last() string {
	for i := len(f.got) - 1; i >= 0; i-- {
		if f.got[i].ID != "" {
			return f.got[i].ID
		}
	}
	return "-1"
}

// read reads c until it ends (or stop says so) and records what arrived.
func (f *follower) read(ctx context.Context, c *websocket.Conn, stop func([]envelope) bool) error {
	n := len(f.got)
	var (
		got []envelope
		err error
	)
	if stop != nil {
		got, f.status, err = readFrames(ctx, c, func(es []envelope) bool { return stop(append(f.got[:n:n], es...)) })
	} else {
		got, f.status, err = readFrames(ctx, c, nil)
	}
	f.got = append(f.got, got...)
	return err
}

// resume follows the run on gw from the last offset received until the log's close (1000),
// resuming again when a socket ends otherwise, and fails the test at ctx's end.
func (f *follower) resume(tb testing.TB, ctx context.Context, gw *gateway) {
	tb.Helper()
	for {
		c, err := dialWS(ctx, resumeURL(gw, f.runID, f.last()))
		if err != nil {
			tb.Fatalf("resume %s on %s after %s: %v", f.runID, gw.Addr, f.last(), err)
		}
		err = f.read(ctx, c, nil)
		c.CloseNow()
		if f.status == websocket.StatusNormalClosure {
			return
		}
		if ctx.Err() != nil {
			tb.Fatalf("resume %s on %s: %v after %d events (last %v)", f.runID, gw.Addr, err, len(f.got), f.got[max(len(f.got)-1, 0):])
		}
		f.drops++
		tb.Logf("resume socket of %s on %s ended %v (%v); resuming again", f.runID, gw.Addr, f.status, err)
	}
}

// startTurn opens a conversation socket on gw and sends a run frame for the demo agent.
func startTurn(tb testing.TB, ctx context.Context, gw *gateway, runID, demoOpts string) *websocket.Conn {
	tb.Helper()
	c, err := dialWS(ctx, gw.WS)
	if err != nil {
		tb.Fatalf("dial %s: %v", gw.WS, err)
	}
	tb.Cleanup(func() { c.CloseNow() })
	if err := c.Write(ctx, websocket.MessageText, demoRunFrame(runID, demoOpts)); err != nil {
		tb.Fatalf("write run frame: %v", err)
	}
	return c
}

// TestClusterResumeOnOtherGateway: a turn produced on gateway A is resumed through gateway B
// after the client's socket to A drops, and joined on B while it runs: every client
// assembles the complete turn, in order, without a duplicate, equal to the log.
func TestClusterResumeOnOtherGateway(t *testing.T) {
	top := startTopology(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const tokens = 200
	opts := fmt.Sprintf(`{"tokens":%d,"intervalMs":10}`, tokens)
	runID := "run-across"

	c := startTurn(t, ctx, top.A, runID, opts)
	client := &follower{runID: runID}
	if err := client.read(ctx, c, contentCount(40)); err != nil {
		t.Fatalf("reading the turn on A: %v", err)
	}
	// A joiner on B from the start, while the turn runs on A.
	joiner := &follower{runID: runID}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		jc, err := dialWS(ctx, resumeURL(top.B, runID, "-1"))
		if err != nil {
			t.Errorf("join on B: %v", err)
			return
		}
		defer jc.CloseNow()
		joiner.read(ctx, jc, nil)
	}()
	c.CloseNow() // the socket to A drops
	client.resume(t, ctx, top.B)
	wg.Wait()

	checkSequence(t, "client resumed on B", client.got, tokens)
	if joiner.status != websocket.StatusNormalClosure {
		t.Errorf("joiner on B closed %v, want 1000", joiner.status)
	}
	checkSequence(t, "joiner on B", joiner.got, tokens)
	log := readLog(t, ctx, top.A, runID)
	sameLog(t, "client resumed on B vs the log", client.got, log)
	sameLog(t, "joiner on B vs the log", joiner.got, log)
}

// TestClusterGatewayKilled: kill -9 of gateway A mid-turn. The client resumes through B and
// gets every event stored before the kill, then RUN_ERROR code producer_lost, then the close,
// within the lease TTL plus 5 s of the kill.
func TestClusterGatewayKilled(t *testing.T) {
	top := startTopology(t, "--lease-ttl", testLeaseTTL.String(), "--takeover", "off")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const tokens = 5000
	runID := "run-killed"
	c := startTurn(t, ctx, top.A, runID, fmt.Sprintf(`{"tokens":%d,"intervalMs":20}`, tokens))
	client := &follower{runID: runID}
	if err := client.read(ctx, c, contentCount(30)); err != nil {
		t.Fatalf("reading the turn on A: %v", err)
	}
	top.A.signal(t, syscall.SIGKILL)
	killed := time.Now()
	top.A.wait(t, 10*time.Second)
	// What A delivered before it died: the socket may still hold frames sent before the kill.
	client.read(ctx, c, nil)
	delivered := len(client.got)

	client.resume(t, ctx, top.B)
	took := time.Since(killed)
	if code := checkSequence(t, "client resumed on B", client.got, tokens, "producer_lost"); code != "producer_lost" {
		t.Errorf("the turn of the killed gateway ended with code %q, want producer_lost", code)
	}
	if took > testLeaseTTL+5*time.Second {
		t.Errorf("the resume closed %v after the kill, want within the lease TTL %v plus 5s", took, testLeaseTTL)
	}
	log := readLog(t, ctx, top.B, runID)
	sameLog(t, "client vs the log", client.got, log)
	t.Logf("A delivered %d events before the kill; B served %d more (the terminal included); closed %v after the kill",
		delivered, len(client.got)-delivered, took.Round(10*time.Millisecond))
}

// TestClusterNATSNodeKilled: kill -9 of the NATS node leading the run-log stream while turns
// run on both gateways: every turn completes, and every client (the producers' sockets and
// joiners on the other gateway) assembles the complete turn, without a gap or a duplicate.
func TestClusterNATSNodeKilled(t *testing.T) {
	top := startTopology(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const tokens = 300
	opts := fmt.Sprintf(`{"tokens":%d,"intervalMs":15}`, tokens)
	type run struct {
		id         string
		on, joinOn *gateway
	}
	runs := []run{{"run-node-a", top.A, top.B}, {"run-node-b", top.B, top.A}}
	var clients []*follower
	var names []string
	var wg sync.WaitGroup
	started := make(chan struct{}, 2*len(runs))
	for _, r := range runs {
		c := startTurn(t, ctx, r.on, r.id, opts)
		producer := &follower{runID: r.id}
		joiner := &follower{runID: r.id}
		clients = append(clients, producer, joiner)
		names = append(names, r.id+" on its socket", r.id+" joined on the other gateway")
		wg.Add(2)
		go func() {
			defer wg.Done()
			producer.read(ctx, c, func(es []envelope) bool {
				if len(es) == 1 {
					started <- struct{}{}
				}
				return turnEnded(es)
			})
		}()
		go func() {
			defer wg.Done()
			jc, err := dialWS(ctx, resumeURL(r.joinOn, r.id, "-1"))
			if err != nil {
				t.Errorf("join %s: %v", r.id, err)
				return
			}
			defer jc.CloseNow()
			joiner.read(ctx, jc, contentCount(20))
			started <- struct{}{}
			joiner.read(ctx, jc, nil)
		}()
	}
	for range 2 * len(runs) {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the turns did not start")
		}
	}
	leader := top.NATS.streamLeader(t, ctx)
	leader.kill(t, syscall.SIGKILL)
	t.Logf("killed the stream leader %s", leader.Name)
	wg.Wait()
	for i, f := range clients {
		checkSequence(t, names[i], f.got, tokens)
	}
	for i, f := range clients {
		if i%2 == 1 && f.status != websocket.StatusNormalClosure {
			t.Errorf("%s: closed %v, want 1000", names[i], f.status)
		}
	}
	// The cluster goes on with two nodes: a new turn completes on each gateway.
	for _, gw := range []*gateway{top.A, top.B} {
		runID := "run-after-" + gw.Addr
		c := startTurn(t, ctx, gw, runID, `{"tokens":5,"intervalMs":0}`)
		f := &follower{runID: runID}
		f.read(ctx, c, turnEnded)
		checkSequence(t, "a turn after the node loss", f.got, 5)
	}
}

// TestClusterRollingRestart: SIGTERM of gateway A mid-turn (a rolling restart). Its clients
// get 1012 and resume through B; a turn that fits in the drain timeout completes, one that
// does not ends with RUN_ERROR code shutdown; every event stored is served, once.
func TestClusterRollingRestart(t *testing.T) {
	top := startTopology(t, "--drain-timeout", "3s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tests := []struct {
		runID  string
		tokens int
		code   string // the RUN_ERROR code that ends the turn; "" when it completes
	}{
		{"run-drained", 60, ""},       // about 1.2 s: finishes within the drain timeout
		{"run-cut", 1000, "shutdown"}, // about 20 s: ended by the drain timeout
	}
	conns := make([]*websocket.Conn, len(tests))
	clients := make([]*follower, len(tests))
	for i, tt := range tests {
		conns[i] = startTurn(t, ctx, top.A, tt.runID, fmt.Sprintf(`{"tokens":%d,"intervalMs":20}`, tt.tokens))
		clients[i] = &follower{runID: tt.runID}
	}
	for i := range tests {
		if err := clients[i].read(ctx, conns[i], contentCount(10)); err != nil {
			t.Fatalf("%s: %v", tests[i].runID, err)
		}
	}
	top.A.signal(t, syscall.SIGTERM)
	for i, tt := range tests {
		clients[i].read(ctx, conns[i], nil)
		if clients[i].status != websocket.StatusServiceRestart {
			t.Errorf("%s: the socket to A closed %v on SIGTERM, want 1012", tt.runID, clients[i].status)
		}
		clients[i].resume(t, ctx, top.B)
	}
	if err := top.A.wait(t, 30*time.Second); err != nil {
		t.Errorf("A exited with %v after SIGTERM, want 0", err)
	}
	for i, tt := range tests {
		var codes []string
		if tt.code != "" {
			codes = []string{tt.code}
		}
		if code := checkSequence(t, tt.runID, clients[i].got, tt.tokens, codes...); code != tt.code {
			t.Errorf("%s ended with code %q, want %q", tt.runID, code, tt.code)
		}
		sameLog(t, tt.runID+": client vs the log", clients[i].got, readLog(t, ctx, top.B, tt.runID))
	}
}

// TestClusterNATSOutage stops every NATS node for a few seconds. Meanwhile both gateways
// answer /readyz 503, a new turn gets a bare RUN_ERROR code log_unavailable, and a resume
// ends (1011, or the whole log once NATS is back) instead of hanging. When NATS is back, both
// gateways are ready again by themselves; the turn that ran across the outage completes (its
// appends were retried), new turns run, the logs written before are served, and the reaper
// still ends the turns of a gateway killed after the outage.
func TestClusterNATSOutage(t *testing.T) {
	top := startTopology(t, "--lease-ttl", testLeaseTTL.String(), "--takeover", "off")
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	gws := []*gateway{top.A, top.B}

	// A finished turn, to be served after the outage, and one running across it.
	before := startTurn(t, ctx, top.A, "run-before", `{"tokens":20,"intervalMs":0}`)
	bf := &follower{runID: "run-before"}
	bf.read(ctx, before, func(es []envelope) bool { return es[len(es)-1].Type == "RUN_FINISHED" })
	const acrossTokens = 400
	across := startTurn(t, ctx, top.A, "run-across-outage", fmt.Sprintf(`{"tokens":%d,"intervalMs":20}`, acrossTokens))
	af := &follower{runID: "run-across-outage"}
	if err := af.read(ctx, across, contentCount(10)); err != nil {
		t.Fatal(err)
	}
	acrossDone := make(chan struct{})
	go func() {
		defer close(acrossDone)
		af.read(ctx, across, turnEnded)
	}()

	down := time.Now()
	for _, n := range top.NATS.Nodes {
		n.kill(t, syscall.SIGKILL)
	}
	for _, gw := range gws {
		waitStatus(t, ctx, gw.URL+"/readyz", 503, 15*time.Second)
	}
	t.Logf("both gateways not ready %v after NATS went down", time.Since(down).Round(10*time.Millisecond))

	// A resume does not hang: it fails, or it is served once NATS is back.
	resumed := &follower{runID: "run-before"}
	resumeDone := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		defer func() { resumeDone <- time.Since(start) }()
		rc, err := dialWS(ctx, resumeURL(top.B, "run-before", "-1"))
		if err != nil {
			t.Errorf("resume during the outage: %v", err)
			return
		}
		defer rc.CloseNow()
		resumed.read(ctx, rc, nil)
	}()
	// A new turn fails clearly and promptly.
	start := time.Now()
	c := startTurn(t, ctx, top.B, "run-during", `{"tokens":5,"intervalMs":0}`)
	nf := &follower{runID: "run-during"}
	nf.read(ctx, c, func(es []envelope) bool { return es[len(es)-1].Type == "RUN_ERROR" })
	took := time.Since(start)
	if n := len(nf.got); n != 1 || !nf.got[0].Bare || nf.got[0].Code != "log_unavailable" {
		t.Errorf("a turn sent while NATS is down got %+v, want one bare RUN_ERROR code log_unavailable", nf.got)
	}
	if took > 15*time.Second {
		t.Errorf("the turn sent while NATS is down got its RUN_ERROR after %v, want it within 15s", took)
	}
	t.Logf("a turn sent while NATS is down got RUN_ERROR %s after %v", nf.got[0].Code, took.Round(10*time.Millisecond))

	for _, n := range top.NATS.Nodes {
		n.start(t)
	}
	up := time.Now()
	for _, gw := range gws {
		waitStatus(t, ctx, gw.URL+"/readyz", 200, 60*time.Second)
	}
	t.Logf("NATS down for %v; both gateways ready again %v after it came back",
		up.Sub(down).Round(10*time.Millisecond), time.Since(up).Round(10*time.Millisecond))

	select {
	case d := <-resumeDone:
		switch resumed.status {
		case websocket.StatusInternalError:
		case websocket.StatusNormalClosure:
			sameLog(t, "a resume that waited for NATS", resumed.got, bf.got)
		default:
			t.Errorf("a resume during the outage closed %v, want 1011 or 1000", resumed.status)
		}
		t.Logf("a resume sent during the outage closed %v after %v", resumed.status, d.Round(10*time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("a resume sent during the outage still runs 30s after NATS came back")
	}
	select {
	case <-acrossDone:
	case <-ctx.Done():
		t.Fatalf("the turn running across the outage never ended for its client (%d events)", len(af.got))
	}
	checkSequence(t, "turn across the outage", af.got, acrossTokens)
	sameLog(t, "turn across the outage: client vs the log", af.got, readLog(t, ctx, top.B, "run-across-outage"))

	for _, gw := range gws {
		runID := "run-after-" + gw.Addr
		c := startTurn(t, ctx, gw, runID, `{"tokens":5,"intervalMs":0}`)
		f := &follower{runID: runID}
		f.read(ctx, c, turnEnded)
		checkSequence(t, "a turn after the outage on "+gw.Addr, f.got, 5)
		sameLog(t, "the log written before the outage", bf.got, readLog(t, ctx, gw, "run-before"))
	}

	// The reapers still work: a turn of a gateway killed now ends with producer_lost. Right
	// after an outage the reapers hold off one lease TTL from when JetStream answers them
	// again (producers could not renew during the outage); past that grace the usual bound
	// holds.
	time.Sleep(testLeaseTTL)
	const tokens = 5000
	k := startTurn(t, ctx, top.A, "run-killed-after", fmt.Sprintf(`{"tokens":%d,"intervalMs":20}`, tokens))
	kf := &follower{runID: "run-killed-after"}
	kf.read(ctx, k, contentCount(5))
	top.A.signal(t, syscall.SIGKILL)
	killed := time.Now()
	top.A.wait(t, 10*time.Second)
	kf.read(ctx, k, nil)
	kf.resume(t, ctx, top.B)
	checkSequence(t, "a turn of a gateway killed after the outage", kf.got, tokens, "producer_lost")
	if took := time.Since(killed); took > testLeaseTTL+5*time.Second {
		t.Errorf("after the outage, the turn of a killed gateway was ended %v after the kill, want within %v", took, testLeaseTTL+5*time.Second)
	}
}

// waitStatus polls url until it answers status, failing the test after within.
func waitStatus(tb testing.TB, ctx context.Context, url string, status int, within time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		got, body, err := httpGet(rctx, url)
		rcancel()
		if err == nil && got == status {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("GET %s never answered %d within %v (last %d %q, %v)", url, status, within, got, body, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
