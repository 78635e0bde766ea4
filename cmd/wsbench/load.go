package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/protocol"
)

// loadConfig is the command line of a load run.
type loadConfig struct {
	URL          string
	Label        string
	Sockets      int
	Active       int
	Turns        int
	Tokens       int
	IntervalMs   int
	Drop         float64
	SourceIPs    int
	Dialers      int
	PID          int
	MetricsURL   string
	IdleSettle   time.Duration
	TurnTimeout  time.Duration
	Progress     time.Duration
	Replay       int
	ReplayRepeat int
	JSON         bool
	MaxResumes   int
	ReadLimitMiB int
	Timestamps   bool
	Stagger      time.Duration
	IdleAfter    time.Duration
	SampleEvery  time.Duration
}

func parseLoadFlags(args []string, stderr io.Writer) (loadConfig, error) {
	var c loadConfig
	fs := flag.NewFlagSet("wsbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.URL, "url", "ws://127.0.0.1:8080/ws", "the server's WebSocket endpoint")
	fs.StringVar(&c.Label, "label", "", "a name for this run in the report (default: the URL)")
	fs.IntVar(&c.Sockets, "sockets", 50, "conversation sockets to open")
	fs.IntVar(&c.Active, "active", -1, "sockets that stream turns (default: all, none with --turns 0); the others stay idle")
	fs.IntVar(&c.Turns, "turns", 1, "turns per active socket, one after the other")
	fs.IntVar(&c.Tokens, "tokens", 200, "content deltas per turn (forwardedProps.demo.tokens)")
	fs.IntVar(&c.IntervalMs, "interval-ms", 0, "time between two events of a turn (forwardedProps.demo.intervalMs)")
	fs.Float64Var(&c.Drop, "drop", 0, "probability, per received event, of cutting the socket and resuming from the last offset")
	fs.IntVar(&c.SourceIPs, "source-ips", 1, "dial from this many loopback addresses 127.0.0.1… (many sockets need several)")
	fs.IntVar(&c.Dialers, "dialers", 32, "sockets dialed at once")
	fs.IntVar(&c.PID, "pid", 0, "the server's process id, to read its resident memory from /proc/<pid>/status")
	fs.StringVar(&c.MetricsURL, "metrics-url", "", "the gateway's /metrics, for its memory, goroutines and delivery histogram")
	fs.DurationVar(&c.IdleSettle, "idle-settle", 2*time.Second, "how long the open sockets sit idle before their memory is measured")
	fs.DurationVar(&c.TurnTimeout, "turn-timeout", 2*time.Minute, "a turn not complete after this long is an error")
	fs.DurationVar(&c.Progress, "progress", time.Second, "interval of the progress line on stderr (0: none)")
	fs.IntVar(&c.Replay, "replay", 0, "after the turns, replay this many completed runs from their start (?offset=-1) and measure the catch-up rate")
	fs.IntVar(&c.ReplayRepeat, "replay-repeat", 1, "replay each of the --replay runs this many times; every replay's time from dial to its last event is measured")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON instead of a table")
	fs.IntVar(&c.MaxResumes, "max-resumes", 20, "resumes allowed per turn before it is an error")
	fs.IntVar(&c.ReadLimitMiB, "read-limit-mib", 1, "largest frame accepted, in MiB")
	fs.BoolVar(&c.Timestamps, "timestamps", false, "ask the agent to timestamp its events (forwardedProps.demo.timestamps) and measure their latency from emit to receipt")
	fs.DurationVar(&c.Stagger, "stagger", 0, "spread the active sockets' first run frames evenly over this long (0: all at once)")
	fs.DurationVar(&c.IdleAfter, "idle-after", 0, "after the turns, keep every socket open and idle this long, sampling the server's memory (the idle curve)")
	fs.DurationVar(&c.SampleEvery, "sample-every", 10*time.Second, "interval of the idle curve's samples")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.Active < 0 || c.Active > c.Sockets {
		c.Active = c.Sockets
	}
	if c.Turns == 0 {
		c.Active = 0 // every socket idles
	}
	switch {
	case c.Sockets < 1:
		return c, errors.New("--sockets must be at least 1")
	case c.Tokens < 1:
		return c, errors.New("--tokens must be at least 1")
	case c.Turns < 0 || c.IntervalMs < 0 || c.Replay < 0 || c.Stagger < 0:
		return c, errors.New("--turns, --interval-ms, --replay and --stagger must not be negative")
	case c.IdleAfter < 0 || c.SampleEvery <= 0:
		return c, errors.New("--idle-after must not be negative, --sample-every must be positive")
	case c.ReplayRepeat < 1:
		return c, errors.New("--replay-repeat must be at least 1")
	case c.Drop < 0 || c.Drop >= 1:
		return c, errors.New("--drop must be in [0, 1)")
	case c.SourceIPs < 1 || c.SourceIPs > 254:
		return c, errors.New("--source-ips must be in 1…254")
	case c.Dialers < 1:
		return c, errors.New("--dialers must be at least 1")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		return c, fmt.Errorf("--url %q is not a ws:// URL", c.URL)
	}
	if c.Label == "" {
		c.Label = c.URL
	}
	return c, nil
}

func loadMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseLoadFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "wsbench:", err)
		return 2
	}
	rep, err := runLoad(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench:", err)
		return 1
	}
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		rep.writeTable(stdout)
	}
	if rep.Errors > 0 || rep.TurnsCompleted != int64(cfg.Active*cfg.Turns) {
		return 1
	}
	return 0
}

// counters are shared by all sockets of a run and read by the progress line.
type counters struct {
	events    atomic.Int64
	turns     atomic.Int64
	failed    atomic.Int64
	resumes   atomic.Int64
	errors    atomic.Int64
	open      atomic.Int64
	errMu     sync.Mutex
	errSample []string
}

// fail counts err and keeps the first few for the report.
func (c *counters) fail(err error) {
	c.errors.Add(1)
	c.errMu.Lock()
	if len(c.errSample) < 10 {
		c.errSample = append(c.errSample, err.Error())
	}
	c.errMu.Unlock()
}

// bench is one load run.
type bench struct {
	cfg     loadConfig
	tag     string // makes this run's runIds unique
	clients []*http.Client
	c       counters

	latMu      sync.Mutex
	eventLat   []time.Duration
	firstLat   []time.Duration
	doneRunsMu sync.Mutex
	doneRuns   []string
	peakRSS    atomic.Int64
}

func runLoad(ctx context.Context, cfg loadConfig, stderr io.Writer) (*report, error) {
	b := &bench{cfg: cfg, tag: strconv.FormatInt(time.Now().UnixNano()%1e10, 36)}
	for i := range cfg.SourceIPs {
		b.clients = append(b.clients, sourceClient(i, cfg.SourceIPs))
	}
	rep := &report{Label: cfg.Label, URL: cfg.URL, Sockets: cfg.Sockets, Active: cfg.Active, Turns: cfg.Turns,
		Tokens: cfg.Tokens, IntervalMs: cfg.IntervalMs, Drop: cfg.Drop, Timestamps: cfg.Timestamps,
		StaggerMs: float64(cfg.Stagger) / float64(time.Millisecond), EventsPerTurn: scriptLen(cfg.Tokens)}
	mem := memProbe{pid: cfg.PID, metricsURL: cfg.MetricsURL}
	rep.RSSBaseBytes = mem.rss(ctx)
	deliveryBefore := scrapeHistogram(ctx, cfg.MetricsURL, deliveryMetric)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopProgress := b.startProgress(runCtx, stderr, &mem)
	defer stopProgress()

	// Dial every socket. A socket that streams no turn reads from its dial on until the end,
	// however long the others take to dial: its reads answer the heartbeat's pings, and a
	// close or a frame the server sends it is an error.
	idleCtx, stopIdle := context.WithCancel(runCtx)
	var idleWG sync.WaitGroup
	dialStart := time.Now()
	socks := make([]*sock, cfg.Sockets)
	sem := make(chan struct{}, cfg.Dialers)
	var wg sync.WaitGroup
	var dialErr atomic.Pointer[error]
	for i := range socks {
		sem <- struct{}{}
		if dialErr.Load() != nil || runCtx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s := &sock{b: b, id: i, client: b.clients[i%len(b.clients)], chk: newChecker(cfg.Tokens)}
			if err := s.dialConversation(runCtx); err != nil {
				err = fmt.Errorf("dial socket %d: %w", i, err)
				dialErr.CompareAndSwap(nil, &err)
				return
			}
			socks[i] = s
			if i >= cfg.Active {
				idleWG.Add(1)
				go func() { defer idleWG.Done(); s.idle(idleCtx) }()
			}
		}()
	}
	wg.Wait()
	rep.DialSeconds = time.Since(dialStart).Seconds()
	defer func() {
		for _, s := range socks {
			if s != nil && s.conn != nil {
				s.conn.CloseNow()
			}
		}
	}()
	defer func() { stopIdle(); idleWG.Wait() }() // before the sockets close: no reader reports it
	if p := dialErr.Load(); p != nil {
		return nil, *p
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Idle: every socket open, sending nothing.
	select {
	case <-time.After(cfg.IdleSettle):
	case <-ctx.Done():
		stopIdle()
		return nil, ctx.Err()
	}
	rep.RSSIdleBytes = mem.rss(ctx)
	rep.Goroutines = scrapeGauge(ctx, cfg.MetricsURL, "go_goroutines")
	if rep.RSSBaseBytes > 0 && rep.RSSIdleBytes > 0 {
		rep.IdleBytesPerSocket = float64(rep.RSSIdleBytes-rep.RSSBaseBytes) / float64(cfg.Sockets)
	}

	// Load: the active sockets stream their turns.
	cpu0, flt0 := procStat(cfg.PID)
	self0 := selfCPU()
	start := time.Now()
	var loadWG sync.WaitGroup
	for i, s := range socks[:cfg.Active] {
		loadWG.Add(1)
		delay := cfg.Stagger * time.Duration(i) / time.Duration(cfg.Active)
		go func() { defer loadWG.Done(); s.turns(runCtx, delay) }()
	}
	loadWG.Wait()
	elapsed := time.Since(start)
	cpu1, flt1 := procStat(cfg.PID)
	self1 := selfCPU()
	if cfg.IdleAfter > 0 {
		// The active sockets idle too (their reads answer the heartbeat's pings).
		for _, s := range socks[:cfg.Active] {
			idleWG.Add(1)
			go func() { defer idleWG.Done(); s.idle(idleCtx) }()
		}
		rep.IdleCurve = b.idleCurve(ctx, &mem, rep.RSSBaseBytes)
	}
	stopIdle()
	idleWG.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.LoadSeconds = elapsed.Seconds()
	rep.Events = b.c.events.Load()
	rep.EventsPerSec = float64(rep.Events) / elapsed.Seconds()
	if cpu0 > 0 && rep.Events > 0 {
		rep.ServerCPUSeconds = (cpu1 - cpu0).Seconds()
		rep.ServerCPUUsPerEvent = float64((cpu1-cpu0)/time.Microsecond) / float64(rep.Events)
		rep.ServerMinorFaults = flt1 - flt0
	}
	if rep.Events > 0 {
		rep.ClientCPUUsPerEvent = float64((self1-self0)/time.Microsecond) / float64(rep.Events)
	}
	rep.TurnsCompleted = b.c.turns.Load()
	rep.TurnsFailed = b.c.failed.Load()
	rep.Resumes = b.c.resumes.Load()
	rep.EventLatency = summarize(b.eventLat)
	rep.FirstEventLatency = summarize(b.firstLat)
	if after := scrapeHistogram(ctx, cfg.MetricsURL, deliveryMetric); after != nil {
		rep.ServerDelivery = after.sub(deliveryBefore).summary()
	}
	stopProgress()
	rep.RSSPeakBytes = max(b.peakRSS.Load(), mem.rss(ctx))

	if cfg.Replay > 0 {
		rep.Replay = b.replay(runCtx, cfg.Replay)
	}
	rep.Errors = b.c.errors.Load()
	rep.ErrorSample = b.c.errSample
	return rep, nil
}

// sourceClient returns an HTTP client dialing from 127.0.0.(i+1) when n > 1.
func sourceClient(i, n int) *http.Client {
	d := &net.Dialer{Timeout: 30 * time.Second}
	if n > 1 {
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i+1))}
	}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// sock is one conversation socket and the turns it streams.
type sock struct {
	b      *bench
	id     int
	client *http.Client
	conn   *websocket.Conn
	chk    *checker
	rng    *rand.Rand

	// The last frame read: its bytes, the members of the frame and of its event, and the
	// fields the checker reads.
	buf    bytes.Buffer
	frame  protocol.Fields
	chunk  protocol.Fields
	meta   protocol.Fields // the event's metadata
	offset string          // the envelope's id; "" for a bare event
	bare   bool            // a bare event, ev holds its type, code and message
	ev     event           // the envelope's event, or the bare event
	recv   time.Time       // when the frame was read, before it was decoded

	eventLat []time.Duration
	firstLat []time.Duration
}

// event is the part of an AG-UI event the checker and the latency measure read.
type event struct {
	Type      string
	Name      string
	Delta     string
	Code      string
	Message   string
	Timestamp float64 // milliseconds since the epoch, with a fraction; 0 when absent
}

// eventOf reads the fields of an event from its members, and of its metadata into meta. The
// emit time is metadata.emitMicros when there is one (the agent/demo and the reference server
// set it), else the AG-UI timestamp, in whole milliseconds.
func eventOf(f, meta *protocol.Fields) event {
	ts, _ := f.Number("timestamp")
	if f.Object("metadata", meta) {
		if us, ok := meta.Number("emitMicros"); ok {
			ts = us / 1000
		}
	}
	return event{Type: f.Str("type"), Name: f.Str("name"), Delta: f.Str("delta"),
		Code: f.Str("code"), Message: f.Str("message"), Timestamp: ts}
}

func (s *sock) dial(ctx context.Context, u string) (*websocket.Conn, error) {
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: s.client})
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(int64(s.b.cfg.ReadLimitMiB) << 20)
	return conn, nil
}

func (s *sock) dialConversation(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := s.dial(dctx, s.b.cfg.URL)
	if err != nil {
		return err
	}
	s.conn = conn
	s.b.c.open.Add(1)
	return nil
}

// read reads the next data frame, skipping {"type":"ping"}, into s.offset, s.bare and s.ev.
// It reads without a context: coder/websocket arms a timer for every read given a context
// that can end, so a turn (or an idle or replay socket) is bounded instead by a watchdog that
// closes the socket (watch).
func (s *sock) read(conn *websocket.Conn) error {
	for {
		typ, r, err := conn.Reader(context.Background())
		if err != nil {
			return err
		}
		s.buf.Reset()
		if _, err := s.buf.ReadFrom(r); err != nil {
			return err
		}
		s.recv = time.Now()
		if typ != websocket.MessageText {
			continue
		}
		if err := s.frame.Parse(s.buf.Bytes()); err != nil {
			return fmt.Errorf("frame is not a JSON object (%v): %q", err, s.buf.Bytes())
		}
		if s.frame.Raw("type") != nil {
			s.offset, s.bare, s.ev = "", true, eventOf(&s.frame, &s.meta)
			if s.ev.Type == "ping" {
				continue
			}
			return nil
		}
		s.offset, s.bare, s.ev = s.frame.Str("id"), false, event{}
		if s.frame.Object("chunk", &s.chunk) {
			s.ev = eventOf(&s.chunk, &s.meta)
		}
		return nil
	}
}

// sinceTimestamp returns the time from an AG-UI timestamp (milliseconds since the epoch, a
// fraction allowed) to t, to the microsecond.
func sinceTimestamp(t time.Time, ms float64) time.Duration {
	return t.Sub(time.UnixMicro(int64(math.Round(ms * 1000))))
}

// watch closes the socket *conn holds when ctx ends, so that a read blocked on it returns;
// stop ends the watch. The socket may change (a resume): store it in conn, then check ctx.
func watch(ctx context.Context, conn *atomic.Pointer[websocket.Conn]) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		if c := conn.Load(); c != nil {
			c.CloseNow()
		}
	})
}

// idle reads (and ignores) frames until ctx is cancelled.
func (s *sock) idle(ctx context.Context) {
	if s.conn == nil {
		return // its turn failed and closed it (counted then)
	}
	var conn atomic.Pointer[websocket.Conn]
	conn.Store(s.conn)
	defer watch(ctx, &conn)()
	for {
		if err := s.read(s.conn); err != nil {
			if ctx.Err() == nil {
				s.b.c.fail(fmt.Errorf("idle socket %d: %w", s.id, err))
			}
			return
		}
		if ctx.Err() == nil {
			s.b.c.fail(fmt.Errorf("idle socket %d received %s", s.id, s.buf.Bytes()))
		}
	}
}

// turns streams the socket's turns one after the other.
func (s *sock) turns(ctx context.Context, delay time.Duration) {
	s.rng = rand.New(rand.NewPCG(uint64(s.id), uint64(time.Now().UnixNano())))
	defer func() {
		s.b.latMu.Lock()
		s.b.eventLat = append(s.b.eventLat, s.eventLat...)
		s.b.firstLat = append(s.b.firstLat, s.firstLat...)
		s.b.latMu.Unlock()
	}()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	for k := range s.b.cfg.Turns {
		if ctx.Err() != nil {
			return
		}
		if s.conn == nil {
			if err := s.dialConversation(ctx); err != nil {
				s.b.c.failed.Add(int64(s.b.cfg.Turns - k))
				s.b.c.fail(fmt.Errorf("socket %d: redial: %w", s.id, err))
				return
			}
		}
		runID := fmt.Sprintf("bench-%s-%d-%d", s.b.tag, s.id, k)
		tctx, cancel := context.WithTimeout(ctx, s.b.cfg.TurnTimeout)
		err := s.turn(tctx, runID)
		cancel()
		if err != nil {
			s.b.c.failed.Add(1)
			if ctx.Err() == nil {
				s.b.c.fail(fmt.Errorf("socket %d turn %s: %w", s.id, runID, err))
			}
			if s.conn != nil {
				s.conn.CloseNow()
				s.conn = nil
				s.b.c.open.Add(-1)
			}
			continue
		}
		s.b.c.turns.Add(1)
		s.b.doneRunsMu.Lock()
		if len(s.b.doneRuns) < 1024 {
			s.b.doneRuns = append(s.b.doneRuns, runID)
		}
		s.b.doneRunsMu.Unlock()
	}
}

// runFrame is the RunAgentInput of one benchmark turn.
func (s *sock) runFrame(runID string) []byte {
	ts := ""
	if s.b.cfg.Timestamps {
		ts = `,"timestamps":true`
	}
	return fmt.Appendf(nil, `{"threadId":"thread-%s-%d","runId":%q,"messages":[{"id":"m-%s","role":"user","content":"bench"}],"tools":[],"context":[],"forwardedProps":{"demo":{"tokens":%d,"intervalMs":%d%s}}}`,
		s.b.tag, s.id, runID, runID, s.b.cfg.Tokens, s.b.cfg.IntervalMs, ts)
}

// turn sends one run frame and reads its events to the terminal one, resuming after drops.
// When ctx ends (the turn's time limit) the socket being read is closed and turn returns
// ctx's error.
func (s *sock) turn(ctx context.Context, runID string) error {
	s.chk.reset(s.b.cfg.Tokens)
	conn := s.conn
	var reading atomic.Pointer[websocket.Conn]
	reading.Store(conn)
	defer watch(ctx, &reading)()
	sent := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, s.runFrame(runID)); err != nil {
		return fmt.Errorf("send run frame: %w", err)
	}
	first := true
	resumes := 0
	for !s.chk.done {
		err := s.read(conn)
		if err == nil {
			if s.bare {
				return fmt.Errorf("bare %s %s: %s", s.ev.Type, s.ev.Code, s.ev.Message)
			}
			if first {
				s.firstLat = append(s.firstLat, s.recv.Sub(sent))
				first = false
			}
			// The agent's events only: run.accepted is the server's marker.
			if ts := s.ev.Timestamp; ts > 0 && !(s.ev.Type == "CUSTOM" && s.ev.Name == acceptedName) {
				s.eventLat = append(s.eventLat, sinceTimestamp(s.recv, ts))
			}
			if err := s.chk.add(s.offset, &s.ev); err != nil {
				return err
			}
			s.b.c.events.Add(1)
			if s.chk.done || s.b.cfg.Drop == 0 || s.rng.Float64() >= s.b.cfg.Drop {
				continue
			}
			// A drop: cut the socket as a network failure would.
			conn.CloseNow()
			err = errors.New("dropped")
		} else if conn != s.conn && websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			// A resume socket closes 1000 at the end of the log; done was checked above.
			return fmt.Errorf("resume socket closed 1000 before the terminal event")
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The conversation socket (or a resume socket) is gone: resume from the last offset.
		if conn == s.conn {
			s.conn = nil
			s.b.c.open.Add(-1)
		} else {
			conn.CloseNow()
		}
		if s.chk.last == "" || resumes == s.b.cfg.MaxResumes {
			return fmt.Errorf("connection lost after %d resumes: %w", resumes, err)
		}
		resumes++
		s.b.c.resumes.Add(1)
		q := url.Values{"runId": {runID}, "offset": {s.chk.last}}
		c, derr := s.dial(ctx, s.b.cfg.URL+"?"+q.Encode())
		if derr != nil {
			return fmt.Errorf("resume: %w", derr)
		}
		conn = c
		reading.Store(c)
		if ctx.Err() != nil { // the watchdog may have run before the Store
			c.CloseNow()
			return ctx.Err()
		}
	}
	if conn != s.conn {
		conn.Close(websocket.StatusNormalClosure, "")
	}
	return nil
}

// replay reads up to n completed runs from their start, each cfg.ReplayRepeat times, one
// after the other, and measures the catch-up rate and each replay's time from the start of its
// dial to the receipt of its last event.
func (b *bench) replay(ctx context.Context, n int) *replayReport {
	b.doneRunsMu.Lock()
	runs := append([]string(nil), b.doneRuns...)
	b.doneRunsMu.Unlock()
	if len(runs) > n {
		runs = runs[:n]
	}
	s := &sock{b: b, client: b.clients[0], chk: newChecker(b.cfg.Tokens)}
	rep := &replayReport{}
	var lat, first []time.Duration
	start := time.Now()
	for range b.cfg.ReplayRepeat {
		for _, runID := range runs {
			if ctx.Err() != nil {
				break
			}
			q := url.Values{"runId": {runID}, "offset": {"-1"}}
			dialed := time.Now()
			conn, err := s.dial(ctx, b.cfg.URL+"?"+q.Encode())
			if err != nil {
				b.c.fail(fmt.Errorf("replay %s: %w", runID, err))
				continue
			}
			s.chk.reset(b.cfg.Tokens)
			var reading atomic.Pointer[websocket.Conn]
			reading.Store(conn)
			stop := watch(ctx, &reading)
			for {
				err := s.read(conn)
				if err != nil {
					if websocket.CloseStatus(err) != websocket.StatusNormalClosure || !s.chk.done {
						b.c.fail(fmt.Errorf("replay %s after %d events: %w", runID, s.chk.events, err))
					}
					break
				}
				if err := s.chk.add(s.offset, &s.ev); err != nil {
					b.c.fail(fmt.Errorf("replay %s: %w", runID, err))
					break
				}
				rep.Events++
				if s.chk.events == 1 {
					first = append(first, s.recv.Sub(dialed))
				}
				if s.chk.done {
					lat = append(lat, s.recv.Sub(dialed))
				}
			}
			stop()
			conn.CloseNow()
			rep.Runs++
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	if rep.Seconds > 0 {
		rep.EventsPerSec = float64(rep.Events) / rep.Seconds
	}
	rep.Latency, rep.FirstLatency = summarize(lat), summarize(first)
	return rep
}

// idleCurve samples the server's memory every cfg.SampleEvery for cfg.IdleAfter while every
// socket idles, the first sample at once. With --pid it reads the server's CPU every second
// too: each sample after the first holds the busiest second since the one before (the
// heartbeats' CPU comes in waves when many sockets are pinged at once).
func (b *bench) idleCurve(ctx context.Context, mem *memProbe, base int64) []idleSample {
	var curve []idleSample
	start := time.Now()
	sec := time.NewTicker(time.Second)
	defer sec.Stop()
	lastCPU, _ := procStat(b.cfg.PID)
	var peak time.Duration
	next := start
	for {
		if now := time.Now(); !now.Before(next) {
			// One scrape per sample: each costs the server allocations of its own.
			g := scrapeGauges(ctx, b.cfg.MetricsURL, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines")
			x := idleSample{Seconds: now.Sub(start).Seconds(), RSSBytes: mem.rss(ctx),
				HeapInuseBytes: g[0], StackInuseBytes: g[1], Goroutines: g[2], CPUPeakSeconds: peak.Seconds()}
			if base > 0 && x.RSSBytes > 0 {
				x.RSSPerSocket = float64(x.RSSBytes-base) / float64(b.cfg.Sockets)
			}
			curve = append(curve, x)
			peak = 0
			if now.Sub(start) >= b.cfg.IdleAfter {
				return curve
			}
			next = next.Add(b.cfg.SampleEvery)
		}
		select {
		case <-sec.C:
			cpu, _ := procStat(b.cfg.PID)
			peak, lastCPU = max(peak, cpu-lastCPU), cpu
		case <-ctx.Done():
			return curve
		}
	}
}

// startProgress prints a progress line every cfg.Progress and samples the server's memory.
func (b *bench) startProgress(ctx context.Context, w io.Writer, mem *memProbe) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	every := b.cfg.Progress
	go func() {
		defer close(done)
		if every <= 0 {
			every = time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		start := time.Now()
		var lastEvents int64
		last := start
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				ev := b.c.events.Load()
				rate := float64(ev-lastEvents) / now.Sub(last).Seconds()
				lastEvents, last = ev, now
				rss := mem.rss(ctx)
				if rss > b.peakRSS.Load() {
					b.peakRSS.Store(rss)
				}
				if b.cfg.Progress > 0 {
					fmt.Fprintf(w, "wsbench %s t=%4.0fs open=%d turns=%d/%d events=%d rate=%.0f/s resumes=%d errors=%d rss=%s\n",
						b.cfg.Label, now.Sub(start).Seconds(), b.c.open.Load(), b.c.turns.Load(), b.cfg.Active*b.cfg.Turns,
						ev, rate, b.c.resumes.Load(), b.c.errors.Load(), mib(rss))
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

func mib(b int64) string {
	if b <= 0 {
		return "?"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + "MiB"
}
