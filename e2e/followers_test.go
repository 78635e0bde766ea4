package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var followersN = flag.Int("followers", 100, "followers of one live run in TestManyFollowersOneRun (the full size: 1000)")

// TestManyFollowersOneRun: many resume sockets follow one live turn on one gateway (on a
// three-node NATS cluster of processes). While they follow, the run's NATS consumers, counted
// from the server, are at most 2 (the shared tail and at most one catch-up); every follower
// gets the complete turn, in order, without a duplicate. The gateway's CPU per delivered
// event with one follower and with all of them is logged (a figure, not an assertion).
func TestManyFollowersOneRun(t *testing.T) {
	n := *followersN
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startNATSCluster(t)
	args := append(composeGatewayFlags(t), "--nats-url", c.URLs, "--max-principal-sockets", strconv.Itoa(n+16))
	gw := startGateway(t, args...)

	nc, err := nats.Connect(c.URLs, nats.Name("e2e"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	const tokens = 200
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":100}`, tokens) // 20 s

	one := followRun(t, ctx, gw, js, "one-follower", demo, tokens, 1)
	many := followRun(t, ctx, gw, js, "many-followers", demo, tokens, n)
	if t.Failed() {
		return
	}
	t.Logf("%d followers of one live run (all sockets open %v after the first dial, the turn lasting about 20 s): at most %d NATS consumers for the run while they followed (%d samples), every follower complete and duplicate-free",
		n, many.opening.Round(10*time.Millisecond), many.maxConsumers, many.samples)
	// The turn's production (the agent's events written to the log) is in both figures.
	t.Logf("gateway CPU per delivered event: %.1f µs with 1 follower (%d events, %v), %.1f µs with %d (%d events, %v); ratio %.2f",
		one.perEvent(), one.delivered, one.cpu, many.perEvent(), n, many.delivered, many.cpu, many.perEvent()/one.perEvent())
	if many.maxConsumers == 0 {
		t.Errorf("no NATS consumer of the run seen while %d followers followed: the count does not see their reads", n)
	}
	if many.maxConsumers > 2 {
		t.Errorf("%d NATS consumers for the run while %d followers followed, want at most 2", many.maxConsumers, n)
	}
}

// followResult is what followRun measured.
type followResult struct {
	maxConsumers int
	samples      int
	delivered    int           // events received by all the followers together
	cpu          time.Duration // the gateway's user+system CPU while they followed
	opening      time.Duration // from the first dial to the last socket open
}

func (r followResult) perEvent() float64 {
	return float64(r.cpu.Microseconds()) / float64(r.delivered)
}

// followRun starts a live demo turn runID on gw, opens n resume sockets on it from the start
// once its first delta went out, reads each to the log's close, and checks each follower got
// the complete turn. Meanwhile it samples the consumers of the run from the NATS servers.
func followRun(t *testing.T, ctx context.Context, gw *gateway, js natsjs.JetStream, runID, demo string, tokens, n int) followResult {
	t.Helper()
	before := runSubjects(t, ctx, js)
	producer := startTurn(t, ctx, gw, runID, demo)
	if _, _, err := readFrames(ctx, producer, contentCount(1)); err != nil {
		t.Fatalf("%s: first delta: %v", runID, err)
	}
	var subject string
	for s := range runSubjects(t, ctx, js) {
		if !before[s] {
			subject = s
		}
	}
	if subject == "" {
		t.Fatalf("%s: no new subject in the run streams", runID)
	}
	go readFrames(ctx, producer, turnEnded)

	streams := runStreams(t, ctx, js)
	var res followResult
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			res.maxConsumers = max(res.maxConsumers, runConsumers(t, ctx, js, streams, subject))
			res.samples++
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	cpu0 := processCPU(t, gw.cmd.Process.Pid)
	start := time.Now()
	var opened sync.WaitGroup
	opened.Add(n)
	followers := make([]*follower, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // sockets being opened at once
	for i := range followers {
		f := &follower{runID: runID}
		followers[i] = f
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			c, err := dialWS(ctx, resumeURL(gw, runID, "-1"))
			<-sem
			opened.Done()
			if err != nil {
				t.Errorf("%s follower %d: dial: %v", runID, i, err)
				return
			}
			defer c.CloseNow()
			if err := f.read(ctx, c, nil); f.status != websocket.StatusNormalClosure {
				t.Errorf("%s follower %d: socket ended %v (%v) after %d events", runID, i, f.status, err, len(f.got))
			}
		}()
	}
	opened.Wait()
	res.opening = time.Since(start)
	wg.Wait()
	res.cpu = processCPU(t, gw.cmd.Process.Pid) - cpu0
	close(done)
	<-sampled
	for i, f := range followers {
		if code := checkSequence(t, fmt.Sprintf("%s follower %d", runID, i), f.got, tokens); code != "" {
			t.Errorf("%s follower %d ended %q, want the complete turn", runID, i, code)
		}
		res.delivered += len(f.got)
	}
	return res
}

// runSubjects returns the subjects holding messages in the gateway's run streams.
func runSubjects(t *testing.T, ctx context.Context, js natsjs.JetStream) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, name := range runStreams(t, ctx, js) {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := st.Info(ctx, natsjs.WithSubjectFilter(">"))
		if err != nil {
			t.Fatalf("stream %s info: %v", name, err)
		}
		for s := range info.State.Subjects {
			out[s] = true
		}
	}
	return out
}

// runStreams returns the names of the gateway's run streams (runStream and its shards).
func runStreams(t *testing.T, ctx context.Context, js natsjs.JetStream) []string {
	t.Helper()
	var out []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if name == runStream || strings.HasPrefix(name, runStream+"_") {
			out = append(out, name)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatalf("stream names: %v", err)
	}
	return out
}

// runConsumers counts the consumers of the run streams that read subject: those filtering
// it, and those filtering nothing (catch-ups, which read for whichever runs' readers asked).
func runConsumers(t *testing.T, ctx context.Context, js natsjs.JetStream, streams []string, subject string) int {
	count := 0
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Errorf("stream %s: %v", name, err)
			return 0
		}
		list := st.ListConsumers(ctx)
		for ci := range list.Info() {
			f := ci.Config.FilterSubject
			if f == subject || (f == "" && len(ci.Config.FilterSubjects) == 0) || slices.Contains(ci.Config.FilterSubjects, subject) {
				count++
			}
		}
		if err := list.Err(); err != nil {
			t.Errorf("consumers of %s: %v", name, err)
		}
	}
	return count
}

// processCPU returns the user+system CPU time process pid has used (from /proc/pid/stat).
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after its ')' are 3 on.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}
