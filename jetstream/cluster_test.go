package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
	"github.com/wsgateway/wsgateway/internal/testenv"
)

// startCluster starts three JetStream servers routed to each other on loopback, each storing
// in its own directory, and waits until JetStream has a meta leader.
func startCluster(tb testing.TB) []*server.Server {
	tb.Helper()
	// Client ports chosen beside the route ports: a random client port taken after the route
	// ports were chosen could be one of them, and that node would not start.
	ports := testenv.FreePorts(tb, 6)
	var routes []string
	for _, p := range ports[:3] {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	var nodes []*server.Server
	for i, p := range ports[:3] {
		nodes = append(nodes, testenv.StartNATS(tb, server.Options{
			Port:       ports[3+i],
			ServerName: fmt.Sprintf("n%d", i+1),
			StoreDir:   tb.TempDir(),
			Cluster:    server.ClusterOpts{Name: "wsgateway-test", Host: "127.0.0.1", Port: p},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, n := range nodes {
			if n.JetStreamIsClustered() && n.JetStreamIsCurrent() {
				ready++
			}
		}
		if ready == len(nodes) {
			return nodes
		}
		if time.Now().After(deadline) {
			tb.Fatal("cluster: no JetStream meta leader after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterLeaderLoss kills the stream leader of a 3-node cluster (replicas 3) while a run
// is appending: every append succeeds, and the log holds every event once, in order.
func TestClusterLeaderLoss(t *testing.T) {
	nodes := startCluster(t)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.ClientURL())
	}
	s := openClusterStore(t, strings.Join(urls, ","))
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "replicated", "t")
	if err != nil {
		t.Fatal(err)
	}

	const total = 3000
	m := &model{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range total {
			e := event("replicated", i)
			w.Append(e, m.stored(e))
			if i%20 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	for m.len() < total/4 {
		time.Sleep(5 * time.Millisecond)
	}
	info, err := s.firstStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := ""
	for _, n := range nodes {
		if n.Name() == info.Cluster.Leader {
			killed = n.Name()
			n.Shutdown()
		}
	}
	if killed == "" {
		t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
	}
	t.Logf("killed stream leader %s after %d stored events", killed, m.len())
	wg.Wait()
	waitDeadline := time.Now().Add(90 * time.Second)
	for {
		m.mu.Lock()
		n, errs := len(m.offsets), len(m.errs)
		m.mu.Unlock()
		if n+errs == total {
			break
		}
		if time.Now().After(waitDeadline) {
			t.Fatalf("%d of %d appends settled after the leader loss", n+errs, total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(m.errs) > 0 {
		t.Fatalf("appends failed across the leader loss: %d, first %v", len(m.errs), m.errs[0])
	}
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r, err := s.Read(ctx, "alice", "replicated", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	for i := range total {
		want = append(want, event("replicated", i))
	}
	checkEntries(t, "log after leader loss", readAll(t, r), want, m.offsets)
}

// faultCluster is a 3-node cluster whose nodes are reached only through loopback proxies (the
// client ports, and the route ports the nodes advertise to each other), so that a test can
// crash a node the way kill -9 does: every connection to it ends at once, and the others learn
// of its loss only from their timeouts, with none of the notices a Shutdown sends (its pull
// consumers' requests ended, its raft leaderships handed over, its departure announced).
type faultCluster struct {
	nodes  []*server.Server
	client []*tcpproxy.Proxy // in front of each node's client port
	route  []*tcpproxy.Proxy // in front of each node's route port
	mu     sync.Mutex
	dead   map[string]bool // server IDs of the crashed nodes
}

// startFaultCluster starts a faultCluster and waits until JetStream has a meta leader.
func startFaultCluster(tb testing.TB) *faultCluster {
	tb.Helper()
	fc := &faultCluster{dead: map[string]bool{}}
	var routes []string
	for i := range 3 {
		fc.client = append(fc.client, tcpproxy.Start(tb, "", nil))
		fc.route = append(fc.route, tcpproxy.Start(tb, "", fc.isDead))
		routes = append(routes, "nats-route://"+fc.route[i].Addr())
	}
	for i := range 3 {
		n := testenv.StartNATS(tb, server.Options{
			ServerName:      fmt.Sprintf("n%d", i+1),
			ClientAdvertise: fc.client[i].Addr(),
			StoreDir:        tb.TempDir(),
			Cluster: server.ClusterOpts{Name: "wsgateway-test", Host: "127.0.0.1", Port: server.RANDOM_PORT,
				Advertise: fc.route[i].Addr()},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		})
		fc.nodes = append(fc.nodes, n)
		fc.client[i].SetTarget(strings.TrimPrefix(n.ClientURL(), "nats://"))
		fc.route[i].SetTarget(n.ClusterAddr().String())
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, n := range fc.nodes {
			if n.JetStreamIsClustered() && n.JetStreamIsCurrent() {
				ready++
			}
		}
		if ready == len(fc.nodes) {
			return fc
		}
		if time.Now().After(deadline) {
			tb.Fatal("cluster: no JetStream meta leader after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// urls returns the client URLs of the nodes, comma-separated.
func (fc *faultCluster) urls() string {
	var urls []string
	for _, p := range fc.client {
		urls = append(urls, "nats://"+p.Addr())
	}
	return strings.Join(urls, ",")
}

// crash cuts node i off: its connections end, and it can make no new one. It keeps running,
// alone, until the test ends.
func (fc *faultCluster) crash(i int) {
	fc.mu.Lock()
	fc.dead[fc.nodes[i].ID()] = true
	fc.mu.Unlock()
	fc.client[i].Close()
	fc.route[i].Close()
	for _, p := range fc.route {
		p.CutRefused()
	}
}

// isDead says whether a route connection comes from a crashed node, by the server ID in the
// CONNECT it opens with.
func (fc *faultCluster) isDead(first []byte) bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for id := range fc.dead {
		if strings.Contains(string(first), `"name":"`+id+`"`) {
			return true
		}
	}
	return false
}

// openClusterStore opens a store on a cluster with replicas 3, retrying while the cluster
// settles.
func openClusterStore(t testing.TB, urls string) *Store {
	t.Helper()
	cfg := testConfig(t)
	cfg.URLs = urls
	cfg.Replicas = 3
	cfg.LeaseTTL = 30 * time.Second
	cfg.DedupWindow = 60 * time.Second
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := Open(ctx, cfg)
		cancel()
		if err == nil {
			t.Cleanup(func() { s.Close() })
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("Open on the cluster: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// follower reads a Reader in the background, keeping what it returned.
type follower struct {
	r       *Reader
	mu      sync.Mutex
	entries []Entry
	err     error         // what ended Next
	done    chan struct{} // closed when Next returned an error
	ended   time.Time     // when
}

func startFollower(r *Reader) *follower {
	f := &follower{r: r, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			e, err := r.Next(context.Background())
			f.mu.Lock()
			if err != nil {
				f.err, f.ended = err, time.Now()
				f.mu.Unlock()
				return
			}
			f.entries = append(f.entries, e)
			f.mu.Unlock()
		}
	}()
	return f
}

func (f *follower) got() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Entry(nil), f.entries...)
}

// waitFor waits until the follower holds n entries, and reports whether it did before until.
func (f *follower) waitFor(n int, until time.Time) bool {
	for len(f.got()) < n {
		if time.Now().After(until) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// stop closes the reader and waits for Next to return.
func (f *follower) stop() {
	f.r.Close()
	<-f.done
}

// onNode returns how many consumers of s's stream live on the node named name.
func onNode(t *testing.T, s *Store, name string) int {
	t.Helper()
	n := 0
	consumers := s.firstStream().ListConsumers(context.Background())
	for c := range consumers.Info() {
		if c.Cluster != nil && c.Cluster.Leader == name {
			n++
		}
	}
	if err := consumers.Err(); err != nil {
		t.Fatalf("listing consumers: %v", err)
	}
	return n
}

// consumerCount returns how many consumers s's stream has.
func consumerCount(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	consumers := s.firstStream().ListConsumers(context.Background())
	for range consumers.Info() {
		n++
	}
	if err := consumers.Err(); err != nil {
		t.Fatalf("listing consumers: %v", err)
	}
	return n
}

// streamLeader returns the index of the node leading s's stream.
func streamLeader(t *testing.T, s *Store, fc *faultCluster) int {
	t.Helper()
	info, err := s.firstStream().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range fc.nodes {
		if n.Name() == info.Cluster.Leader {
			return i
		}
	}
	t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
	return -1
}

// TestClusterReaderLeaderCrash crashes the node leading the stream, the one the store is
// connected to, not the meta leader (as kill -9 does: no notice of its end reaches the
// others), while readers follow an open log and its writer keeps appending. The readers
// share one consumer (the log's tail), opened until it is on that node. Every reader returns
// every event once, in order, within a
// bound well under the time the cluster takes to declare a silent node gone (150s: five
// missed 30s statistics heartbeats).
func TestClusterReaderLeaderCrash(t *testing.T) {
	fc := startFaultCluster(t)
	// A first store creates the stream, whose leader is moved off the meta leader; the
	// test's store connects to the stream leader (and learns the other nodes from it, to
	// reconnect to).
	s0 := openClusterStore(t, fc.urls())
	leader := streamLeader(t, s0, fc)
	for attempt := 0; fc.nodes[leader].Name() == metaLeader(fc); attempt++ {
		if attempt == 5 {
			t.Fatal("the stream leader stays the meta leader")
		}
		if _, err := s0.nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+s0.cfg.Stream, nil, 10*time.Second); err != nil {
			t.Fatalf("stream leader stepdown: %v", err)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if info, err := s0.firstStream().Info(context.Background()); err == nil && info.Cluster.Leader != "" &&
				info.Cluster.Leader != fc.nodes[leader].Name() {
				break
			}
		}
		leader = streamLeader(t, s0, fc)
	}
	s := openClusterStore(t, "nats://"+fc.client[leader].Addr())
	if got, want := s.nc.ConnectedServerName(), fc.nodes[leader].Name(); got != want {
		t.Fatalf("the store is connected to %s, want the stream leader %s", got, want)
	}
	ctx := context.Background()
	const run, total = "crash", 250
	w, err := s.Create(ctx, "alice", run, "t")
	if err != nil {
		t.Fatal(err)
	}
	m := &model{}
	appendN := func(from, to int) {
		for i := from; i < to; i++ {
			e := event(run, i)
			w.Append(e, m.stored(e))
			time.Sleep(5 * time.Millisecond)
		}
	}
	appendN(0, 50)
	if l := streamLeader(t, s, fc); l != leader {
		t.Fatalf("the stream leader moved from %s to %s", fc.nodes[leader].Name(), fc.nodes[l].Name())
	}
	name := fc.nodes[leader].Name()
	var readers []*follower
	defer func() {
		for i, f := range readers {
			start := time.Now()
			f.stop()
			if took := time.Since(start); took > time.Second {
				t.Logf("closing reader %d took %v", i, took.Round(time.Millisecond))
			}
		}
	}()
	// The readers share the log's tail, one consumer: readers are opened three at a time
	// until that consumer is on the stream leader.
	for attempt := 0; ; attempt++ {
		for range 3 {
			r, err := s.Read(ctx, "alice", run, FromStart)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			readers = append(readers, startFollower(r))
		}
		for _, f := range readers { // the tail's consumer exists once they read
			if !f.waitFor(1, time.Now().Add(30*time.Second)) {
				t.Fatal("a reader got nothing of the log in 30s")
			}
		}
		if onNode(t, s, name) > 0 {
			break
		}
		if attempt == 40 {
			t.Fatalf("no shared tail's consumer on the stream leader in %d attempts", attempt)
		}
		for _, f := range readers {
			f.stop()
		}
		readers = nil
		// Their consumers go with them; one whose creation or delete raced with its
		// reader's close on a busy cluster goes within the server's inactive threshold.
		for deadline := time.Now().Add(readerInactiveThreshold + 5*time.Second); consumerCount(t, s) > 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				logConsumers(t, s)
				t.Fatal("the shared tail's consumer outlived its readers")
			}
		}
	}
	// A reader that started behind the tail reads with a consumer of its own until it has
	// caught up, then attaches (tail.go): on a busy machine that takes a moment.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := consumerCount(t, s)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d readers of one log hold %d consumers, want one shared", len(readers), n)
		}
	}
	t.Logf("%d readers share one consumer, on the stream leader %s; meta leader %s; the store connected to %s",
		len(readers), name, metaLeader(fc), s.nc.ConnectedServerName())

	fc.crash(leader)
	crashed := time.Now()
	appendN(50, total)
	for deadline := time.Now().Add(60 * time.Second); m.len()+len(m.failures()) < total; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d appends settled 60s after the crash", m.len()+len(m.failures()), total)
		}
	}
	if errs := m.failures(); len(errs) > 0 {
		t.Fatalf("appends failed across the crash: %d, first %v", len(errs), errs[0])
	}
	t.Logf("every event stored %v after the crash", time.Since(crashed).Round(time.Millisecond))
	deadline := time.Now().Add(60 * time.Second)
	for i, f := range readers {
		if !f.waitFor(total, deadline) {
			t.Errorf("reader %d: %d of %d events %v after the crash", i, len(f.got()), total, time.Since(crashed).Round(time.Second))
		}
	}
	if t.Failed() {
		logConsumers(t, s)
		t.FailNow()
	}
	t.Logf("every reader has every event %v after the crash", time.Since(crashed).Round(time.Millisecond))
	for i, f := range readers {
		checkEntries(t, fmt.Sprintf("reader %d", i), f.got(), m.events, m.offsets)
	}
}

// TestClusterReaderCloseWhileFollowing: a reader's consumer is lost with two of the three
// nodes, so the reader is re-creating it, in vain, while the stream has no quorum. Close
// makes its blocked Next return at once.
func TestClusterReaderCloseWhileFollowing(t *testing.T) {
	fc := startFaultCluster(t)
	s := openClusterStore(t, fc.urls())
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "quorum", "t")
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, w, [][]byte{event("q", 0)})
	r, err := s.Read(ctx, "alice", "quorum", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	f := startFollower(r)
	defer f.stop()
	if !f.waitFor(1, time.Now().Add(30*time.Second)) {
		t.Fatal("the reader got no event in 30s")
	}
	host := -1
	for i, n := range fc.nodes {
		if onNode(t, s, n.Name()) == 1 {
			host = i
		}
	}
	if host < 0 {
		t.Fatal("the reader's consumer is on none of the nodes")
	}
	fc.crash(host)
	fc.crash((host + 1) % 3)
	// Long enough for the consumer's loss to be noticed, even by nats.go's ordered consumer
	// (two missed 5s heartbeats), which readers used to hold.
	time.Sleep(15 * time.Second)
	select {
	case <-f.done:
		t.Fatalf("Next returned %v before Close", f.err)
	default:
	}
	closed := time.Now()
	go r.Close()
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Next still blocked 30s after Close")
	}
	if took := f.ended.Sub(closed); took > time.Second {
		t.Errorf("Next returned %v after Close, want at once", took.Round(time.Millisecond))
	}
	if !errors.Is(f.err, ErrClosed) {
		t.Errorf("Next after Close = %v, want ErrClosed", f.err)
	}
}

// failures returns the appends that failed so far.
func (m *model) failures() []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]error(nil), m.errs...)
}

// logConsumers logs the consumers of s's stream, to tell a failing test's story.
func logConsumers(t *testing.T, s *Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	consumers := s.firstStream().ListConsumers(ctx)
	for c := range consumers.Info() {
		leader := ""
		if c.Cluster != nil {
			leader = c.Cluster.Leader
		}
		t.Logf("consumer %s on %q: delivered stream seq %d, %d pending, %d waiting pulls, created %v",
			c.Name, leader, c.Delivered.Stream, c.NumPending, c.NumWaiting, c.Created.Format(time.TimeOnly))
	}
	if err := consumers.Err(); err != nil {
		t.Logf("listing consumers: %v", err)
	}
}

// metaLeader returns the name of the JetStream meta leader, as the live nodes see it.
func metaLeader(fc *faultCluster) string {
	for _, n := range fc.nodes {
		if n.JetStreamIsLeader() {
			return n.Name()
		}
	}
	return ""
}

// TestClusterBucketLeaderCrash crashes the node leading the run metadata's bucket, as kill -9
// does. Until the others elect a new leader, no one answers the bucket's writes; a run created
// and a run closed in that time wait for the election instead of failing. The store is
// connected to the other nodes: a request in flight on a connection to the crashed node is
// lost, which is another fault (its caller's timeout answers it).
func TestClusterBucketLeaderCrash(t *testing.T) {
	fc := startFaultCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first := openClusterStore(t, fc.urls())
	bucket, err := first.js.Stream(ctx, "KV_"+first.cfg.MetaBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := bucket.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crashed := -1
	var others []string
	for i, n := range fc.nodes {
		if n.Name() == info.Cluster.Leader {
			crashed = i
		} else {
			others = append(others, "nats://"+fc.client[i].Addr())
		}
	}
	if crashed < 0 {
		t.Fatalf("bucket leader %q is none of the nodes", info.Cluster.Leader)
	}
	s := openClusterStore(t, strings.Join(others, ","))
	before, err := s.Create(ctx, "alice", "before-crash", "t")
	if err != nil {
		t.Fatal(err)
	}
	fc.crash(crashed)
	start := time.Now()
	t.Logf("crashed the metadata bucket's leader %s", info.Cluster.Leader)
	if err := before.Close(ctx); err != nil {
		t.Errorf("closing a run during the election: %v", err)
	}
	w, err := s.Create(ctx, "alice", "during-election", "t")
	if err != nil {
		t.Fatalf("creating a run during the election: %v", err)
	}
	m := &model{}
	e := event("during-election", 0)
	w.Append(e, m.stored(e))
	if err := w.Close(ctx); err != nil {
		t.Fatalf("closing the new run: %v", err)
	}
	t.Logf("closed one run and created, appended and closed another %v after the crash", time.Since(start).Round(time.Millisecond))
	for _, run := range []string{"before-crash", "during-election"} {
		r, err := s.Read(ctx, "alice", run, FromStart)
		if err != nil {
			t.Fatalf("read %s: %v", run, err)
		}
		got := readAll(t, r)
		if run == "during-election" && len(got) != 1 {
			t.Errorf("%s: %d events, want 1", run, len(got))
		}
	}
}

// TestProvisionWaitsForPeers creates a stream the cluster can place only on a node it has
// not heard from yet, as a gateway started beside a cluster still forming does: the servers
// refuse ("no suitable peers for placement"), and Provision retries until the node has joined.
// A request refused as bad fails at once.
func TestProvisionWaitsForPeers(t *testing.T) {
	nodes := startCluster(t)
	cfg := testConfig(t)
	cfg.URLs = nodes[0].ClientURL()
	s := openStore(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	calls := 0
	create := func(ctx context.Context) error {
		calls++
		_, err := s.js.CreateOrUpdateStream(ctx, natsjs.StreamConfig{Name: "PLACED", Subjects: []string{"placed.>"},
			Storage: natsjs.FileStorage, Placement: &natsjs.Placement{Tags: []string{"late"}}})
		return err
	}
	// The cluster must refuse first, or this test shows nothing.
	err := create(ctx)
	var apiErr *natsjs.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeNoPeers {
		t.Fatalf("before the node joined: %v, want no suitable peers", err)
	}
	t.Logf("before the node joined: %v", err)

	var routes []string
	for _, n := range nodes {
		routes = append(routes, "nats-route://"+n.ClusterAddr().String())
	}
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		time.Sleep(time.Second)
		testenv.StartNATS(t, server.Options{
			ServerName: "n4",
			Tags:       jwt.TagList{"late"},
			StoreDir:   t.TempDir(),
			Cluster:    server.ClusterOpts{Name: "wsgateway-test", Host: "127.0.0.1", Port: server.RANDOM_PORT},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})
	}()
	calls = 0
	start := time.Now()
	if err := s.Provision(ctx, "a test stream", create); err != nil {
		t.Fatalf("Provision while the node joins: %v", err)
	}
	<-joined
	t.Logf("placed after %d attempts, %v", calls, time.Since(start).Round(time.Millisecond))
	if calls < 2 {
		t.Errorf("Provision succeeded on its first attempt: the refusal it must retry never came")
	}

	calls = 0
	err = s.Provision(ctx, "an overlapping stream", func(ctx context.Context) error {
		calls++
		_, err := s.js.CreateOrUpdateStream(ctx, natsjs.StreamConfig{Name: "OVERLAP", Subjects: []string{"placed.x"}})
		return err
	})
	if err == nil || calls != 1 {
		t.Errorf("a stream whose subjects overlap another's: err %v after %d attempts, want an error after 1", err, calls)
	}
}
