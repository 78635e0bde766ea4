package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// The scale-out topology of docker-compose.yml, as processes on loopback: three nats-server
// processes (built from the nats-server module in go.mod, clustered, JetStream, configured by
// deploy/nats/nats.conf with loopback addresses on the command line) and two gateway
// processes started with the compose file's gateway flags.

var (
	natsOnce sync.Once
	natsBin  string
	natsErr  error
)

// natsServerBinary builds the nats-server command of the module in go.mod, once per test run
// (without the race detector: it is the system under test's dependency, not our code).
func natsServerBinary(tb testing.TB) string {
	tb.Helper()
	natsOnce.Do(func() {
		root, err := testenv.ModuleRoot()
		if err != nil {
			natsErr = err
			return
		}
		bin := filepath.Join(binDir, "nats-server")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			natsErr = fmt.Errorf("go build nats-server: %v\n%s", err, out.Bytes())
			return
		}
		natsBin = bin
	})
	if natsErr != nil {
		tb.Fatal(natsErr)
	}
	return natsBin
}

// natsNode is one nats-server process of a test cluster. It keeps its ports and store
// directory across a kill and a restart.
type natsNode struct {
	Name                      string
	Host                      string   // the address it listens on (127.0.0.1 unless on a lab host)
	on                        *netHost // the lab host it runs on (nil: this machine's namespace)
	Port, ClusterPort, HTTPPt int
	dir                       string
	routes                    string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	logs    testenv.LockedBuffer
}

// URL is the node's client URL.
func (n *natsNode) URL() string { return fmt.Sprintf("nats://%s:%d", n.Host, n.Port) }

// start starts the node's process with deploy/nats/nats.conf, overriding addresses, ports,
// routes and the store directory.
func (n *natsNode) start(tb testing.TB) {
	tb.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{
		"--config", filepath.Join(root, "deploy", "nats", "nats.conf"),
		"--name", n.Name,
		"--addr", n.Host,
		"--port", strconv.Itoa(n.Port),
		"--http_port", strconv.Itoa(n.HTTPPt),
		"--cluster", fmt.Sprintf("nats://%s:%d", n.Host, n.ClusterPort),
		"--routes", n.routes,
		"--store_dir", n.dir,
	}
	cmd := exec.Command(natsServerBinary(tb), args...)
	if n.on != nil {
		cmd = n.on.command(natsServerBinary(tb), args...)
	}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	fmt.Fprintf(&n.logs, "--- start %s\n", n.Name)
	cmd.Stdout, cmd.Stderr = &n.logs, &n.logs
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start nats-server %s: %v", n.Name, err)
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		n.waitErr = err
		n.mu.Unlock()
		close(done)
	}()
}

// running reports whether the node's process is alive.
func (n *natsNode) running() bool {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// kill sends sig to the node's process (by its pid) and waits until it has exited.
func (n *natsNode) kill(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if !n.running() {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		cmd.Process.Kill()
		<-done
		tb.Errorf("nats-server %s did not exit within %v of %v; killed", n.Name, stopTimeout, sig)
	}
}

// natsCluster is a three-node JetStream cluster of processes on loopback.
type natsCluster struct {
	Nodes []*natsNode
	URLs  string // every client URL, comma-separated (--nats-url)
}

// startNATSCluster starts three clustered JetStream nats-server processes, each storing in
// its own temporary directory, waits until every node reports healthy (JetStream up, a meta
// leader elected), and stops them when the test ends. A cluster that does not come up (a port
// picked a moment before and taken meanwhile by another process, a node that exits, no meta
// leader within startTimeout) is stopped, its nodes' logs printed, and started again on new
// ports and directories, up to three times: the tests are about the gateways, not about
// nats-server's bootstrap.
func startNATSCluster(tb testing.TB) *natsCluster {
	tb.Helper()
	return startNATSClusterOn(tb, nil)
}

// startNATSClusterOn is startNATSCluster with one node on each of three lab hosts (their
// names are the nodes'; nil: on loopback), on the ports of deploy/nats/nats.conf.
func startNATSClusterOn(tb testing.TB, hosts []*netHost) *natsCluster {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		c := &natsCluster{}
		var routes, urls []string
		ports := []int{4222, 6222, 8222, 4222, 6222, 8222, 4222, 6222, 8222}
		if hosts == nil {
			ports = testenv.FreePorts(tb, 9)
		}
		for i := range 3 {
			n := &natsNode{
				Name:        fmt.Sprintf("n%d", i+1),
				Host:        "127.0.0.1",
				Port:        ports[3*i],
				ClusterPort: ports[3*i+1],
				HTTPPt:      ports[3*i+2],
				dir:         tb.TempDir(),
			}
			if hosts != nil {
				n.Name, n.Host, n.on = hosts[i].Name, hosts[i].Addr, hosts[i]
			}
			c.Nodes = append(c.Nodes, n)
			routes = append(routes, fmt.Sprintf("nats-route://%s:%d", n.Host, n.ClusterPort))
			urls = append(urls, n.URL())
		}
		c.URLs = strings.Join(urls, ",")
		for _, n := range c.Nodes {
			n.routes = strings.Join(routes, ",")
			n.start(tb)
		}
		err := c.waitHealthy(c.Nodes...)
		if err == nil {
			tb.Cleanup(func() { c.stop(tb) })
			return c
		}
		c.stop(tb)
		for _, n := range c.Nodes {
			tb.Logf("nats-server %s log (tail):\n%s", n.Name, tail(n.logs.String(), 40))
		}
		if attempt == 3 {
			tb.Fatal(err)
		}
		tb.Logf("starting the NATS cluster again on other ports (attempt %d): %v", attempt+1, err)
	}
}

// stop stops every node (SIGTERM, by pid) and prints their logs if the test failed.
func (c *natsCluster) stop(tb testing.TB) {
	for _, n := range c.Nodes {
		n.kill(tb, syscall.SIGTERM)
	}
	if tb.Failed() {
		for _, n := range c.Nodes {
			tb.Logf("nats-server %s log (tail):\n%s", n.Name, tail(n.logs.String(), 40))
		}
	}
}

// waitHealthy polls the nodes' /healthz until each answers 200.
func (c *natsCluster) waitHealthy(nodes ...*natsNode) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, n := range nodes {
		for {
			status, body, err := httpGet(ctx, fmt.Sprintf("http://%s:%d/healthz", n.Host, n.HTTPPt))
			if err == nil && status == 200 {
				break
			}
			for _, m := range nodes {
				if !m.running() {
					return fmt.Errorf("nats-server %s exited while starting:\n%s", m.Name, tail(m.logs.String(), 10))
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("nats-server %s: /healthz never answered 200 (last %d %q, %v)", n.Name, status, body, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// node returns the node named name.
func (c *natsCluster) node(tb testing.TB, name string) *natsNode {
	tb.Helper()
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	tb.Fatalf("no cluster node named %q", name)
	return nil
}

// streamLeader returns the node leading the gateways' run-log stream.
func (c *natsCluster) streamLeader(tb testing.TB, ctx context.Context) *natsNode {
	tb.Helper()
	return c.leaderOf(tb, ctx, runStream)
}

// leaderOf returns the node leading a stream of the gateways, which has 3 replicas.
func (c *natsCluster) leaderOf(tb testing.TB, ctx context.Context, stream string) *natsNode {
	tb.Helper()
	info := c.streamInfo(tb, ctx, stream)
	if info.Cluster == nil || info.Cluster.Leader == "" {
		tb.Fatalf("stream %s has no leader: %+v", stream, info.Cluster)
	}
	if len(info.Cluster.Replicas) != 2 {
		tb.Errorf("stream %s has %d replicas besides its leader, want 2 (--replicas 3)", stream, len(info.Cluster.Replicas))
	}
	return c.node(tb, info.Cluster.Leader)
}

// streamMessages returns how many messages a stream of the gateways holds.
func (c *natsCluster) streamMessages(tb testing.TB, ctx context.Context, stream string) uint64 {
	tb.Helper()
	return c.streamInfo(tb, ctx, stream).State.Msgs
}

// streamInfo asks the cluster about a stream.
func (c *natsCluster) streamInfo(tb testing.TB, ctx context.Context, stream string) *natsjs.StreamInfo {
	tb.Helper()
	nc, err := nats.Connect(c.URLs, nats.Name("e2e"))
	if err != nil {
		tb.Fatalf("connect to the cluster: %v", err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	return st.CachedInfo()
}

// runStream is the gateway's default run-log stream (jetstream.Config.Stream).
const runStream = "WSGATEWAY_RUNS"

// topology is the compose deployment as processes: a NATS cluster and two gateways on it.
type topology struct {
	NATS *natsCluster
	A, B *gateway
}

// startTopology starts a three-node NATS cluster and two gateways on it, each started with
// the flags docker-compose.yml gives its gateways (loopback addresses instead of the compose
// ones), then extra (which win over the compose flags).
func startTopology(tb testing.TB, extra ...string) *topology {
	tb.Helper()
	c := startNATSCluster(tb)
	args := append(composeGatewayFlags(tb), "--nats-url", c.URLs)
	args = append(args, extra...)
	return &topology{NATS: c, A: startGateway(tb, args...), B: startGateway(tb, args...)}
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// envelope is one frame a gateway sent: the event's offset and the parts of the event the
// tests check.
type envelope struct {
	ID      string
	Type    string
	Delta   string
	Code    string
	Message string
	Bare    bool // a RUN_ERROR sent without an envelope (the log could not be written)
}

// key names the event for comparisons: its type, and its delta for content events.
func (e envelope) key() string {
	if e.Delta != "" {
		return e.Type + " " + e.Delta
	}
	return e.Type
}

// parseFrame decodes one text frame: an envelope, a bare RUN_ERROR, or nothing (a ping).
func parseFrame(data []byte) (envelope, bool) {
	var f struct {
		ID    string `json:"id"`
		Chunk *struct {
			Type    string `json:"type"`
			Delta   string `json:"delta"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"chunk"`
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &f) != nil {
		return envelope{}, false
	}
	if f.Chunk != nil {
		return envelope{ID: f.ID, Type: f.Chunk.Type, Delta: f.Chunk.Delta, Code: f.Chunk.Code, Message: f.Chunk.Message}, true
	}
	if f.Type == "RUN_ERROR" {
		return envelope{Type: f.Type, Code: f.Code, Message: f.Message, Bare: true}, true
	}
	return envelope{}, false
}

// readFrames reads c until it closes or fails, or until stop (optional) returns true after
// an envelope. It returns the envelopes, the close status (-1 when the socket failed without
// a close frame, or stop ended the read) and the error that ended the read (nil after stop).
func readFrames(ctx context.Context, c *websocket.Conn, stop func([]envelope) bool) ([]envelope, websocket.StatusCode, error) {
	var out []envelope
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return out, websocket.CloseStatus(err), err
		}
		if e, ok := parseFrame(data); ok {
			out = append(out, e)
			if stop != nil && stop(out) {
				return out, -1, nil
			}
		}
	}
}

// contentCount returns a stop function for readFrames: stop after n content events.
func contentCount(n int) func([]envelope) bool {
	return func(es []envelope) bool {
		got := 0
		for _, e := range es {
			if e.Type == "TEXT_MESSAGE_CONTENT" {
				got++
			}
		}
		return got >= n
	}
}

// turnEnded is a stop function for readFrames: stop after a terminal event.
func turnEnded(es []envelope) bool {
	t := es[len(es)-1].Type
	return t == "RUN_FINISHED" || t == "RUN_ERROR"
}

// dialWS opens a WebSocket to url (a conversation socket, or a resume socket with a query).
func dialWS(ctx context.Context, url string) (*websocket.Conn, error) {
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	return c, nil
}

// demoRunFrame is a run frame for the demo agent.
func demoRunFrame(runID, demoOpts string) []byte {
	return []byte(`{"threadId":"t-` + runID + `","runId":"` + runID + `","messages":[{"id":"u","role":"user","content":"hi"}],"forwardedProps":{"demo":` + demoOpts + `}}`)
}

// resumeURL is the resume socket of runID strictly after offset on gw.
func resumeURL(gw *gateway, runID, offset string) string {
	return gw.WS + "?runId=" + runID + "&offset=" + offset
}

// demoTurn is the event sequence of a demo turn with `tokens` deltas that completes.
func demoTurn(tokens int) []string {
	keys := []string{"CUSTOM", "RUN_STARTED", "TEXT_MESSAGE_START"}
	for i := 1; i <= tokens; i++ {
		keys = append(keys, "TEXT_MESSAGE_CONTENT t"+strconv.Itoa(i)+" ")
	}
	return append(keys, "TEXT_MESSAGE_END", "RUN_FINISHED")
}

// checkSequence checks what a client assembled for a demo turn of `tokens` deltas: offsets
// never empty, strictly increasing (so no duplicate), and the events a prefix of the
// complete turn, followed by at most a RUN_ERROR whose code is one of endCodes ("" allows
// only the complete turn). It returns the RUN_ERROR code ("" for a complete turn) and reports
// a failure through tb.
func checkSequence(tb testing.TB, what string, got []envelope, tokens int, endCodes ...string) string {
	tb.Helper()
	for i, e := range got {
		if e.Bare {
			tb.Errorf("%s: event %d is a bare RUN_ERROR (%s: %s)", what, i, e.Code, e.Message)
			return e.Code
		}
		if e.ID == "" || (i > 0 && e.ID <= got[i-1].ID) {
			tb.Errorf("%s: offset %d %q does not follow %q (a duplicate or a reordering)", what, i, e.ID, got[max(i-1, 0)].ID)
			return ""
		}
	}
	want := demoTurn(tokens)
	n := len(got)
	code := ""
	if n > 0 && got[n-1].Type == "RUN_ERROR" {
		code = got[n-1].Code
		n--
		allowed := false
		for _, c := range endCodes {
			allowed = allowed || c == code
		}
		if !allowed {
			tb.Errorf("%s: ends with RUN_ERROR code %q (%s), want a complete turn or one of %q", what, code, got[n].Message, endCodes)
		}
	} else if n != len(want) {
		tb.Errorf("%s: %d events without a terminal, want the %d of the complete turn (last %v)", what, n, len(want), got[max(n-1, 0):])
	}
	if n > len(want) {
		tb.Errorf("%s: %d events, more than the %d of the complete turn", what, n, len(want))
		n = len(want)
	}
	for i := range n {
		if got[i].key() != want[i] {
			tb.Errorf("%s: event %d is %q, want %q (a gap, a duplicate or a reordering)", what, i, got[i].key(), want[i])
			break
		}
	}
	return code
}

// sameLog checks that a client's assembled sequence equals the run's log as a joiner reads
// it, offsets included.
func sameLog(tb testing.TB, what string, got, log []envelope) {
	tb.Helper()
	if len(got) != len(log) {
		tb.Errorf("%s: the client assembled %d events, the log holds %d", what, len(got), len(log))
		return
	}
	for i := range got {
		if got[i] != log[i] {
			tb.Errorf("%s: event %d: client %+v, log %+v", what, i, got[i], log[i])
			return
		}
	}
}

// readLog joins runID on gw from the start and reads its whole log (until the close 1000).
func readLog(tb testing.TB, ctx context.Context, gw *gateway, runID string) []envelope {
	tb.Helper()
	c, err := dialWS(ctx, resumeURL(gw, runID, "-1"))
	if err != nil {
		tb.Fatalf("join %s on %s: %v", runID, gw.Addr, err)
	}
	defer c.CloseNow()
	log, status, err := readFrames(ctx, c, nil)
	if status != websocket.StatusNormalClosure {
		tb.Fatalf("join %s on %s: closed %v (%v) after %d events, want 1000", runID, gw.Addr, status, err, len(log))
	}
	return log
}
