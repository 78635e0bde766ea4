package jetstream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startCluster starts three JetStream servers routed to each other on loopback, each storing
// in its own directory, and waits until JetStream has a meta leader.
func startCluster(tb testing.TB) []*server.Server {
	tb.Helper()
	ports := []int{freePort(tb), freePort(tb), freePort(tb)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	var nodes []*server.Server
	for i, p := range ports {
		nodes = append(nodes, startServer(tb, server.Options{
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
	cfg := testConfig(t)
	cfg.URLs = strings.Join(urls, ",")
	cfg.Replicas = 3
	cfg.LeaseTTL = 30 * time.Second
	cfg.DedupWindow = 60 * time.Second
	var s *Store
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		s, err = Open(ctx, cfg)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Open on the cluster: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Cleanup(func() { s.Close() })
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
	info, err := s.stream.Info(ctx)
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
