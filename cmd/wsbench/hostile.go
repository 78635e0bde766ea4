package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// hostileConfig is the command line of wsbench hostile.
type hostileConfig struct {
	URL       string
	SecretEnv string
	Attack    time.Duration
	Idle      time.Duration
	Workers   int
	Frames    int
	Others    int
	Every     time.Duration
	Sample    time.Duration
	JSON      bool
	// FloodCPUs, if set, runs the hostile clients in a process of their own pinned to these
	// CPUs (taskset -c): their own CPU stays off the cores of the gateway and of the other
	// principal's client, as a flood from other machines would.
	FloodCPUs string
	// FloodOnly runs the hostile clients alone for Attack and prints their answers (JSON):
	// the process FloodCPUs starts.
	FloodOnly bool
}

// The hostile scenario's principals and turns.
const (
	hostileSubject = "mallory"
	otherSubject   = "trent"
	hostileTurn    = `{"tokens":1000,"intervalMs":1000}` // 1000 s, as long as a demo turn goes
	otherTurn      = `{"tokens":3,"intervalMs":0}`       // an ordinary turn, as short as a reply gets
)

// hostileDoors are the doors the hostile principal starts turns by, in the order each client
// takes them.
var hostileDoors = []string{"socket", "sse", "ndjson", "agui", "thread"}

// hostileMain runs the hostile scenario against a gateway started with --auth jwt and
// --jwt-secret-env: first the other principal's ordinary turns alone for --idle (the idle
// gateway's first-event latency), then for --attack the hostile principal starting long demo
// turns by every door and walking away (--workers clients at once, each in turn: a socket
// that sends --frames run frames and closes, POSTs of /api/chat, /api/chat/ndjson and /agui
// dropped once the stream began, POST /api/threads/{id}/runs), while the other principal runs
// the same turns (--others principals, each starting one every --every). /metrics is sampled every --sample: turns running (started − ended),
// goroutines, limit refusals by limit. The report: the refusals, the maximum of running turns
// and goroutines, the answers each door got, and the other principal's first-event latency
// idle and under attack with their ratio; every one of its turns must finish (exit status 1
// otherwise).
func hostileMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c hostileConfig
	fs := flag.NewFlagSet("wsbench hostile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:8080", "the gateway's base URL")
	fs.StringVar(&c.SecretEnv, "jwt-secret-env", "WSGATEWAY_JWT_SECRET", "environment variable holding the HS256 secret the gateway verifies tokens with")
	fs.DurationVar(&c.Attack, "attack", 15*time.Second, "how long the hostile principal starts turns")
	fs.DurationVar(&c.Idle, "idle", 5*time.Second, "how long the other principal's turns are measured on the idle gateway first")
	fs.IntVar(&c.Workers, "workers", 8, "hostile clients at once")
	fs.IntVar(&c.Frames, "frames", 16, "run frames each hostile socket sends before it closes")
	fs.IntVar(&c.Others, "others", 4, "other principals, each on a socket of its own")
	fs.DurationVar(&c.Every, "every", 200*time.Millisecond, "how often each other principal starts a turn (a person's pace, under the per-principal rate)")
	fs.DurationVar(&c.Sample, "sample", 100*time.Millisecond, "period of the /metrics samples")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON")
	fs.StringVar(&c.FloodCPUs, "flood-cpus", "", "run the hostile clients in a process of their own pinned to these CPUs (taskset -c LIST, e.g. 1), off the cores of the gateway and of the other principal's client; empty: in this process")
	fs.BoolVar(&c.FloodOnly, "flood-only", false, "run the hostile clients alone for --attack and print their answers by door as JSON (what --flood-cpus starts)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	secret := os.Getenv(c.SecretEnv)
	if len(secret) < 32 {
		fmt.Fprintf(stderr, "wsbench hostile: $%s must hold the gateway's HS256 secret (32 bytes or more)\n", c.SecretEnv)
		return 2
	}
	if c.FloodOnly {
		tok, err := hostileToken([]byte(secret), hostileSubject)
		if err != nil {
			fmt.Fprintf(stderr, "wsbench hostile: %v\n", err)
			return 1
		}
		actx, cancel := context.WithTimeout(ctx, c.Attack)
		defer cancel()
		doors := doorCounts{}
		base := strings.TrimRight(c.URL, "/")
		runFlood(actx, base, c.Workers, c.Frames, tok, doors.add)
		json.NewEncoder(stdout).Encode(doors.m)
		return 0
	}
	rep, err := runHostile(ctx, c, []byte(secret), stderr)
	if err != nil {
		fmt.Fprintf(stderr, "wsbench hostile: %v\n", err)
		return 1
	}
	if c.JSON {
		json.NewEncoder(stdout).Encode(rep)
	} else {
		rep.writeTable(stdout)
	}
	if rep.Idle.Failed+rep.Attack.Failed > 0 || rep.Attack.Turns == 0 {
		return 1
	}
	return 0
}

// hostileReport is what wsbench hostile measured.
type hostileReport struct {
	AttackSeconds float64 `json:"attackSeconds"`
	Workers       int     `json:"workers"`
	Frames        int     `json:"framesPerSocket"`
	// Doors counts the hostile principal's attempts by door and answer ("202", "429",
	// "socket" for a socket opened, "error" for a transport failure).
	Doors map[string]map[string]int `json:"doors"`
	// Refusals are the gateway's limit refusals during the attack, by limit.
	Refusals map[string]float64 `json:"refusals"`
	// RunningMax and GoroutinesMax are the maxima sampled over the attack and until its turns
	// were counted; GoroutinesBefore is the idle gateway's.
	RunningMax       float64 `json:"runningMax"`
	GoroutinesBefore float64 `json:"goroutinesBefore"`
	GoroutinesMax    float64 `json:"goroutinesMax"`
	Samples          int     `json:"samples"`
	// Idle and Attack are the other principal's turns alone, then during the attack.
	Idle   probeReport `json:"idle"`
	Attack probeReport `json:"attack"`
	// RatioP50 and RatioP99 are its first-event latency under attack over idle.
	RatioP50 float64 `json:"ratioP50"`
	RatioP99 float64 `json:"ratioP99"`
}

// probeReport is the other principal's turns of one phase: how many finished, failed (a
// RUN_ERROR, or the socket lost), and their first-event latency (run frame written →
// run.accepted read).
type probeReport struct {
	Turns      int          `json:"turns"`
	Failed     int          `json:"failed"`
	FirstEvent *percentiles `json:"firstEventMs"`
}

func runHostile(ctx context.Context, c hostileConfig, secret []byte, stderr io.Writer) (*hostileReport, error) {
	base := strings.TrimRight(c.URL, "/")
	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/ws"
	metricsURL := base + "/metrics"
	hostileTok, err := hostileToken(secret, hostileSubject)
	if err != nil {
		return nil, err
	}
	var others []string
	for i := range c.Others {
		tok, err := hostileToken(secret, fmt.Sprintf("%s-%d", otherSubject, i))
		if err != nil {
			return nil, err
		}
		others = append(others, tok)
	}
	rep := &hostileReport{AttackSeconds: c.Attack.Seconds(), Workers: c.Workers, Frames: c.Frames, Doors: map[string]map[string]int{}}
	before := scrapeSeries(ctx, metricsURL)
	if before == nil {
		return nil, fmt.Errorf("no /metrics at %s", metricsURL)
	}
	rep.GoroutinesBefore = before["go_goroutines"]

	fmt.Fprintf(stderr, "== the other principal's turns on the idle gateway, %v\n", c.Idle)
	idle, err := probeAll(ctx, wsURL, others, "idle", c.Idle, c.Every)
	if err != nil {
		return nil, err
	}
	rep.Idle = idle

	fmt.Fprintf(stderr, "== %d hostile clients for %v, the other principal's turns meanwhile\n", c.Workers, c.Attack)
	actx, stop := context.WithTimeout(ctx, c.Attack)
	defer stop()
	var mu sync.Mutex
	doors := doorCounts{m: rep.Doors}
	var wg sync.WaitGroup
	var floodErr error
	wg.Go(func() {
		if c.FloodCPUs == "" {
			runFlood(actx, base, c.Workers, c.Frames, hostileTok, doors.add)
			return
		}
		floodErr = floodProcess(c, &doors)
	})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(c.Sample)
		defer t.Stop()
		for {
			if s := scrapeSeries(ctx, metricsURL); s != nil {
				mu.Lock()
				rep.Samples++
				rep.RunningMax = max(rep.RunningMax, s["wsgateway_turn_started_total"]-s["wsgateway_turn_ended_total"])
				rep.GoroutinesMax = max(rep.GoroutinesMax, s["go_goroutines"])
				mu.Unlock()
			}
			select {
			case <-actx.Done():
				return
			case <-t.C:
			}
		}
	}()
	attack, err := probeAll(ctx, wsURL, others, "attack", c.Attack, c.Every)
	wg.Wait()
	<-sampled
	if err == nil {
		err = floodErr
	}
	if err != nil {
		return nil, err
	}
	rep.Attack = attack
	after := scrapeSeries(ctx, metricsURL)
	rep.Refusals = map[string]float64{}
	for k, v := range after {
		if limit, ok := strings.CutPrefix(k, refusalsMetric+"/"); ok && v-before[k] > 0 {
			rep.Refusals[limit] = v - before[k]
		}
	}
	rep.RunningMax = max(rep.RunningMax, after["wsgateway_turn_started_total"]-after["wsgateway_turn_ended_total"])
	rep.GoroutinesMax = max(rep.GoroutinesMax, after["go_goroutines"])
	if idle.FirstEvent != nil && attack.FirstEvent != nil {
		rep.RatioP50 = attack.FirstEvent.P50 / idle.FirstEvent.P50
		rep.RatioP99 = attack.FirstEvent.P99 / idle.FirstEvent.P99
	}
	return rep, nil
}

// hostileToken returns an HS256 token of subject sub, valid for an hour.
func hostileToken(secret []byte, sub string) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": sub, "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(),
	}).SignedString(secret)
}

// doorCounts counts the hostile principal's attempts by door and answer; add is safe for
// concurrent use.
type doorCounts struct {
	mu sync.Mutex
	m  map[string]map[string]int
}

func (d *doorCounts) add(door, answer string) { d.addN(door, answer, 1) }

func (d *doorCounts) addN(door, answer string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]map[string]int{}
	}
	if d.m[door] == nil {
		d.m[door] = map[string]int{}
	}
	d.m[door][answer] += n
}

// runFlood runs workers hostile clients until ctx ends, each taking the doors in turn.
func runFlood(ctx context.Context, base string, workers, frames int, tok string, count func(door, answer string)) {
	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/ws"
	var wg sync.WaitGroup
	var seq atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				door := hostileDoors[i%len(hostileDoors)]
				count(door, startHostile(ctx, base, wsURL, tok, door, frames, &seq))
			}
		})
	}
	wg.Wait()
}

// floodProcess runs the hostile clients as `taskset -c c.FloodCPUs wsbench hostile
// --flood-only` and adds their answers to doors.
func floodProcess(c hostileConfig, doors *doorCounts) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command("taskset", "-c", c.FloodCPUs, self, "hostile", "--flood-only",
		"--url", c.URL, "--jwt-secret-env", c.SecretEnv, "--attack", c.Attack.String(),
		"--workers", strconv.Itoa(c.Workers), "--frames", strconv.Itoa(c.Frames))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the flood process (taskset -c %s): %v: %s", c.FloodCPUs, err, stderr.Bytes())
	}
	var got map[string]map[string]int
	if err := json.Unmarshal(out, &got); err != nil {
		return fmt.Errorf("the flood process's answers: %v", err)
	}
	for door, answers := range got {
		for answer, n := range answers {
			doors.addN(door, answer, n)
		}
	}
	return nil
}

// startHostile starts long turns by one door as the hostile principal and walks away; it
// returns the answer it got.
func startHostile(ctx context.Context, base, wsURL, tok, door string, frames int, seq *atomic.Int64) string {
	h := http.Header{"Authorization": {"Bearer " + tok}}
	if door == "socket" {
		c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			if resp != nil {
				return strconv.Itoa(resp.StatusCode)
			}
			return "error"
		}
		for range frames {
			if c.Write(ctx, websocket.MessageText, hostileFrame(fmt.Sprintf("h-%d", seq.Add(1)))) != nil {
				break
			}
		}
		c.CloseNow()
		return "socket"
	}
	path := map[string]string{"sse": "/api/chat", "ndjson": "/api/chat/ndjson", "agui": "/agui", "thread": "/api/threads/t/runs"}[door]
	rctx, cancel := context.WithCancel(ctx)
	defer cancel() // walks away
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, base+path, bytes.NewReader(hostileFrame(fmt.Sprintf("h-%d", seq.Add(1)))))
	if err != nil {
		return "error"
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "error"
	}
	if resp.StatusCode == http.StatusOK {
		resp.Body.Read(make([]byte, 1)) // the stream began
	}
	resp.Body.Close()
	return strconv.Itoa(resp.StatusCode)
}

// demoFrame is a run frame of thread threadID asking the demo agent for demo (its options).
func demoFrame(threadID, runID, demo string) []byte {
	b, _ := json.Marshal(demoInput(threadID, runID, demo))
	return b
}

func demoInput(threadID, runID, demo string) map[string]any {
	return map[string]any{
		"threadId": threadID, "runId": runID,
		"messages":       []any{map[string]any{"id": "u1", "role": "user", "content": "hi"}},
		"forwardedProps": map[string]any{"demo": json.RawMessage(demo)},
	}
}

// hostileFrame is a run frame of the hostile principal: a long demo turn of its one thread,
// started beside the thread's other turns (multitaskStrategy concurrent), so that its turns
// run at once up to the principal's bounds instead of queueing behind each other.
func hostileFrame(runID string) []byte {
	in := demoInput("t", runID, hostileTurn)
	in["multitaskStrategy"] = "concurrent"
	b, _ := json.Marshal(in)
	return b
}

// probeAll runs probe for each of the principals of toks at once and sums their reports.
func probeAll(ctx context.Context, wsURL string, toks []string, phase string, d, every time.Duration) (probeReport, error) {
	var rep probeReport
	var lat []time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	var first error
	for i, tok := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, l, err := probe(ctx, wsURL, tok, fmt.Sprintf("%s-%d", phase, i), d, every)
			mu.Lock()
			defer mu.Unlock()
			rep.Turns += r.Turns
			rep.Failed += r.Failed
			lat = append(lat, l...)
			if first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	rep.FirstEvent = summarize(lat)
	return rep, first
}

// probe runs a principal's turns one after another on one socket for d, one every every (or
// at the previous one's end), and returns their first-event latencies.
func probe(ctx context.Context, wsURL, tok, phase string, d, every time.Duration) (probeReport, []time.Duration, error) {
	var rep probeReport
	var lat []time.Duration
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		return rep, nil, fmt.Errorf("the other principal's socket: %w", err)
	}
	defer c.CloseNow()
	for end, i, next := time.Now().Add(d), 0, time.Now(); next.Before(end); i++ {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		start := time.Now()
		runID := fmt.Sprintf("o-%s-%d-%d", phase, start.UnixNano(), i)
		// A thread of its own: a thread's turns cost more as it grows (BENCHMARKS.md, threads),
		// which would weigh on the later phase.
		err := c.Write(tctx, websocket.MessageText, demoFrame(runID, runID, otherTurn))
		first, failed := true, false
		for err == nil {
			var data []byte
			if _, data, err = c.Read(tctx); err != nil {
				break
			}
			typ, code := frameType(data)
			if typ == "" {
				continue // a heartbeat
			}
			if first {
				lat = append(lat, time.Since(start))
				first = false
			}
			if typ == "RUN_FINISHED" {
				rep.Turns++
				break
			}
			if typ == "RUN_ERROR" {
				fmt.Fprintf(os.Stderr, "the other principal's turn (%s): RUN_ERROR %s\n", phase, code)
				failed = true
				break
			}
		}
		cancel()
		if failed {
			rep.Failed++
		}
		if err != nil {
			rep.Failed++
			if ctx.Err() != nil {
				break
			}
			return rep, lat, fmt.Errorf("the other principal's socket ended (%s): %w", phase, err)
		}
	}
	return rep, lat, nil
}

// frameType returns the AG-UI type of a frame's event (an envelope's chunk, or a bare event)
// and its code; "" for a heartbeat.
func frameType(data []byte) (typ, code string) {
	var f struct {
		Type  string `json:"type"`
		Code  string `json:"code"`
		Chunk *struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"chunk"`
	}
	if json.Unmarshal(data, &f) != nil {
		return "", ""
	}
	if f.Chunk != nil {
		return f.Chunk.Type, f.Chunk.Code
	}
	if f.Type == "ping" {
		return "", ""
	}
	return f.Type, f.Code
}

// refusalsMetric is the gateway's counter of limit refusals, labelled by limit.
const refusalsMetric = "wsgateway_conversation_limit_refusals_total"

// scrapeSeries returns the samples of one scrape of u, each name summed over its label sets,
// and the refusals by limit under "<refusalsMetric>/<limit>"; nil when u does not answer.
func scrapeSeries(ctx context.Context, u string) map[string]float64 {
	body := scrape(ctx, u)
	if body == nil {
		return nil
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		j := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || j < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			continue
		}
		series := line[:j]
		name, labels, _ := strings.Cut(series, "{")
		out[name] += v
		if name == refusalsMetric {
			if _, rest, ok := strings.Cut(labels, `limit="`); ok {
				out[refusalsMetric+"/"+rest[:strings.IndexByte(rest, '"')]] += v
			}
		}
	}
	return out
}

func (r *hostileReport) writeTable(w io.Writer) {
	row := func(k, format string, args ...any) {
		fmt.Fprintf(w, "%-34s "+format+"\n", append([]any{k}, args...)...)
	}
	row("attack", "%.0f s, %d clients, %d run frames per socket", r.AttackSeconds, r.Workers, r.Frames)
	for _, door := range hostileDoors {
		answers := r.Doors[door]
		keys := make([]string, 0, len(answers))
		for k := range answers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, answers[k]))
		}
		row("  "+door, "%s", strings.Join(parts, ", "))
	}
	limits := make([]string, 0, len(r.Refusals))
	for k := range r.Refusals {
		limits = append(limits, k)
	}
	slices.Sort(limits)
	var parts []string
	for _, k := range limits {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, r.Refusals[k]))
	}
	row("refusals", "%s", strings.Join(parts, ", "))
	row("turns running, max sampled", "%.0f (%d samples)", r.RunningMax, r.Samples)
	row("goroutines, before / max", "%.0f / %.0f", r.GoroutinesBefore, r.GoroutinesMax)
	row("other principal, idle", "%d turns, %d failed, first event %s", r.Idle.Turns, r.Idle.Failed, r.Idle.FirstEvent)
	row("other principal, under attack", "%d turns, %d failed, first event %s", r.Attack.Turns, r.Attack.Failed, r.Attack.FirstEvent)
	row("first event, attack / idle", "p50 %.2f×, p99 %.2f×", r.RatioP50, r.RatioP99)
}
