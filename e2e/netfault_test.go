package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// Faults as networks make them: each NATS node and each gateway is a host of its own in a
// network lab (netlab_test.go), and the faults are packets the switch drops, which neither
// end's stack sees: no reset, no refusal, only silence that TCP retransmits into. Latency is
// a relay host between a gateway and NATS (this kernel has no netem qdisc to delay a link).

// netTopology is the compose deployment on lab hosts: NATS nodes n1, n2, n3 and gateways
// ga and gb, started with the compose file's gateway flags, a short lease TTL and extra.
// gaNATS and gbNATS are the nodes each gateway is given (nil: every node; for ga,
// farNATSNodes: every node through the relays of farNATS, 15 ms each way).
type netTopology struct {
	lab    *netLab
	NATS   *natsCluster
	GA, GB *gateway
}

func startNetTopology(tb testing.TB, gaNATS, gbNATS []string, extra ...string) *netTopology {
	tb.Helper()
	lab := newNetLab(tb, "n1", "n2", "n3", "ga", "gb", "wan")
	c := startNATSClusterOn(tb, lab.hosts[:3])
	urls := func(names []string) string {
		if names == nil {
			return c.URLs
		}
		var out string
		for i, name := range names {
			if i > 0 {
				out += ","
			}
			if url, ok := strings.CutPrefix(name, "far:"); ok {
				out += url
				continue
			}
			out += c.node(tb, name).URL()
		}
		return out
	}
	if len(gaNATS) == 1 && gaNATS[0] == farNATSNodes {
		gaNATS = farNATS(tb, lab, 15*time.Millisecond)
	}
	start := func(host string, nodes []string) *gateway {
		args := append(composeGatewayFlags(tb), "--nats-url", urls(nodes), "--lease-ttl", "3s")
		return startGatewayOn(tb, lab.host(host), nil, append(args, extra...)...)
	}
	return &netTopology{lab: lab, NATS: c, GA: start("ga", gaNATS), GB: start("gb", gbNATS)}
}

// farNATS starts, on the lab host "wan", a relay to each NATS node that holds every chunk of
// bytes delay each way (wsbench delay-proxy), and returns the relays' client URLs as
// startNetTopology's node names ("far:nats://…").
func farNATS(tb testing.TB, lab *netLab, delay time.Duration) []string {
	tb.Helper()
	wsbenchOnce.Do(func() { wsbenchBin, wsbenchErr = goBuild(binDir, "./cmd/wsbench") })
	if wsbenchErr != nil {
		tb.Fatalf("building wsbench: %v", wsbenchErr)
	}
	wan := lab.host("wan")
	var names []string
	for i, node := range []string{"n1", "n2", "n3"} {
		listen := fmt.Sprintf("%s:%d", wan.Addr, 14222+i)
		cmd := wan.command(wsbenchBin, "delay-proxy", "--listen", listen, "--target", lab.host(node).Addr+":4222", "--delay", delay.String())
		var out testenv.LockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			tb.Fatalf("start the delay proxy to %s: %v", node, err)
		}
		tb.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if tb.Failed() {
				tb.Logf("delay proxy to %s:\n%s", node, out.String())
			}
		})
		// A gateway started before the relay listens finds no NATS server and exits (it
		// failed so in CI): the relay says it listens once it does.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "delay-proxy "); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				tb.Fatalf("the delay proxy to %s does not listen after 10s: %q", node, out.String())
			}
		}
		names = append(names, "far:nats://"+listen)
	}
	return names
}

// farNATSNodes, as startNetTopology's gaNATS, puts ga far from NATS.
const farNATSNodes = "far"

var (
	wsbenchOnce sync.Once
	wsbenchBin  string
	wsbenchErr  error
)

// natsHosts returns the lab hosts of the NATS nodes named (every node without names).
func (n *netTopology) natsHosts(names ...string) []*netHost {
	if len(names) == 0 {
		names = []string{"n1", "n2", "n3"}
	}
	hs := make([]*netHost, len(names))
	for i, name := range names {
		hs[i] = n.lab.host(name)
	}
	return hs
}

// startTurns starts count demo turns (runIDs prefix-0 ...) on gw and waits until each has
// delivered its first delta.
func startTurns(tb testing.TB, ctx context.Context, gw *gateway, prefix string, count int, demo string) ([]*websocket.Conn, []*follower) {
	tb.Helper()
	conns, fs := make([]*websocket.Conn, count), make([]*follower, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fs[i] = &follower{runID: fmt.Sprintf("%s-%d", prefix, i)}
			conns[i] = startTurn(tb, ctx, gw, fs[i].runID, demo)
			if err := fs[i].read(ctx, conns[i], contentCount(1)); err != nil {
				tb.Errorf("turn %s: %v", fs[i].runID, err)
			}
		}()
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
	return conns, fs
}

// finishTurns reads each turn's socket to its end, resumes on other (by the last offset
// received) where it ended otherwise than 1000, and checks that every client assembled its
// whole turn once, in order, and that each log is the whole turn once and verifies. It
// returns how many sockets closed 1012 ("run moved"), and when the last of them did.
func finishTurns(tb testing.TB, ctx context.Context, conns []*websocket.Conn, fs []*follower, other *gateway, tokens int) (moved int, last time.Time) {
	tb.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.read(ctx, conns[i], turnEnded)
			mu.Lock()
			if f.status == websocket.StatusServiceRestart {
				moved, last = moved+1, time.Now()
			}
			mu.Unlock()
			if len(f.got) == 0 || !turnEnded(f.got) { // the socket ended before the turn: resume elsewhere
				f.resume(tb, ctx, other)
			}
			if code := checkSequence(tb, f.runID, f.got, tokens); code != "" {
				tb.Errorf("%s ended with code %q, want a complete turn", f.runID, code)
			}
		}()
	}
	wg.Wait()
	for _, f := range fs {
		events := chunksOf(tb, ctx, other, f.runID)
		if len(events) != len(demoTurn(tokens))-1 { // demoTurn counts the marker
			tb.Errorf("the log of %s holds %d events, want the %d of a whole turn", f.runID, len(events), len(demoTurn(tokens))-1)
		}
		verifyLog(tb, events)
	}
	return moved, last
}

// TestNetGatewayCutFromNATS: 20 turns stream on gateway ga when the network between ga and
// every NATS node starts to drop packets for 10 s (both ways, or one way only), while ga's
// clients still reach it. The other gateway takes the turns over once ga's lease expires;
// once the network heals, ga learns that it lost them and closes their sockets 1012 "run
// moved"; each client resumes on gb by its last offset and gets the rest of its turn, each
// delta once, then RUN_FINISHED. Nothing ga sent meanwhile is in any log twice or out of
// place: each log holds the whole turn once, and `wsgateway verify` and @ag-ui/client accept it.
func TestNetGatewayCutFromNATS(t *testing.T) {
	const (
		n      = 20
		tokens = 60
		cutFor = 10 * time.Second
	)
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":500}`, tokens) // 30 s: every turn outlasts the cut
	for _, tt := range []struct {
		name string
		cut  func(top *netTopology, gw []*netHost)
	}{
		{"both ways", func(top *netTopology, gw []*netHost) { top.lab.partition(gw, top.natsHosts()) }},
		{"gateway to NATS", func(top *netTopology, gw []*netHost) { top.lab.cut(gw, top.natsHosts()) }},
		{"NATS to gateway", func(top *netTopology, gw []*netHost) { top.lab.cut(top.natsHosts(), gw) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			top := startNetTopology(t, nil, nil)
			conns, fs := startTurns(t, ctx, top.GA, "cut", n, demo)
			tt.cut(top, []*netHost{top.lab.host("ga")})
			time.Sleep(cutFor)
			top.lab.heal()
			healed := time.Now()
			moved, last := finishTurns(t, ctx, conns, fs, top.GB, tokens)
			t.Logf("%d of %d sockets on the cut gateway closed 1012, the last %v after the network healed", moved, n, last.Sub(healed).Round(100*time.Millisecond))
			if moved != n {
				t.Errorf("%d of the cut gateway's %d sockets closed 1012 run moved once the network healed, want all", moved, n)
			}
		})
	}
}

// TestNetNATSNodeCutFromPeers: gateway ga is connected to NATS node n3 alone, gb to n1 and
// n2. With 20 turns streaming on ga and 10 on gb, n3 is cut from its peers for 15 s (a
// minority of one, which its clients still reach). ga can neither store nor renew through n3
// meanwhile, so gb takes its turns over; every client (resuming on the other gateway where
// its socket closes) assembles its whole turn, each delta once, and every log is the whole
// turn once and verifies. A socket of ga whose append failed before ga learnt of the
// takeover is closed 1012 "run moved" all the same, not told log_unavailable: its run goes
// on (or ends) elsewhere, and its client resumes there. The lease TTL is 6 s: the cut may
// take the leaders of the buckets with it, and a gateway whose renewals wait for the new
// leaders' election longer than the TTL is one the other takes for dead (its turns, taken
// over, are whole all the same; the test logs how many of gb's sockets moved).
func TestNetNATSNodeCutFromPeers(t *testing.T) {
	const (
		tokens = 60
		cutFor = 15 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := startNetTopology(t, []string{"n3"}, []string{"n1", "n2"}, "--lease-ttl", "6s")
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":500}`, tokens) // 30 s
	gaConns, gaFs := startTurns(t, ctx, top.GA, "minority", 20, demo)
	gbConns, gbFs := startTurns(t, ctx, top.GB, "majority", 10, demo)
	top.lab.partition(top.natsHosts("n3"), top.natsHosts("n1", "n2"))
	time.Sleep(cutFor)
	top.lab.heal()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		moved, _ := finishTurns(t, ctx, gaConns, gaFs, top.GB, tokens)
		drops := 0
		for _, f := range gaFs {
			drops += f.drops
		}
		t.Logf("%d of the 20 sockets on the gateway of the cut node closed 1012 run moved; their resumes on the majority's gateway ended otherwise than 1000 %d times", moved, drops)
	}()
	go func() {
		defer wg.Done()
		// Resumed, and their logs read, on gb too: ga's node is still catching up with its
		// peers after the cut (a resume there can fail 1011 "resume failed" meanwhile).
		moved, _ := finishTurns(t, ctx, gbConns, gbFs, top.GB, tokens)
		t.Logf("%d of the 10 sockets on the gateway of the majority closed 1012 run moved", moved)
	}()
	wg.Wait()
}

// TestNetFarGatewayKilled: gateway ga reaches NATS through a relay host that holds every
// chunk 15 ms each way (its round trips 30 ms longer than gb's), and every link loses 2% of
// its packets each way. With 20 turns streaming on ga, it is killed (kill -9): appends are in
// flight, some stored and not yet acknowledged, others not stored, when it dies. gb takes the
// turns over: each client, resuming on gb by the last offset it received, assembles its whole
// turn, each delta once, and every log is the whole turn once and verifies.
func TestNetFarGatewayKilled(t *testing.T) {
	const tokens = 60
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := startNetTopology(t, []string{farNATSNodes}, nil)
	// ga's NATS connections (data and liveness) come from the relay host, none from ga.
	from := map[string]int{}
	for _, n := range top.NATS.Nodes {
		status, body, err := httpGet(ctx, fmt.Sprintf("http://%s:%d/connz", n.Host, n.HTTPPt))
		var connz struct {
			Conns []struct {
				IP string `json:"ip"`
			} `json:"connections"`
		}
		if err != nil || status != 200 || json.Unmarshal([]byte(body), &connz) != nil {
			t.Fatalf("GET /connz of %s: %d %v", n.Name, status, err)
		}
		for _, c := range connz.Conns {
			from[c.IP]++
		}
	}
	if from[top.lab.host("wan").Addr] < 2 || from[top.lab.host("ga").Addr] != 0 {
		t.Fatalf("NATS client connections by address %v: want ga's through the relay host %s only", from, top.lab.host("wan").Addr)
	}
	for _, h := range top.lab.hosts {
		top.lab.lose(h, 2)
	}
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":100}`, tokens) // 6 s
	conns, fs := startTurns(t, ctx, top.GA, "far", 20, demo)
	time.Sleep(2 * time.Second)
	top.GA.signal(t, syscall.SIGKILL)
	top.GA.wait(t, 10*time.Second)
	for _, c := range conns {
		c.CloseNow()
	}
	for _, f := range fs {
		if f.last() == "-1" {
			t.Fatalf("%s received nothing before the kill", f.runID)
		}
	}
	if moved, _ := finishTurns(t, ctx, conns, fs, top.GB, tokens); moved != 0 {
		t.Errorf("%d sockets of the killed gateway closed 1012, want none (it is dead)", moved)
	}
}
