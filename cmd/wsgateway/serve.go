package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/auth"
	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/durable"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/threadstore"
	"github.com/wsgateway/wsgateway/turn"
	ledger "github.com/wsgateway/wsgateway/usage"
	"github.com/wsgateway/wsgateway/web"
)

// Log attribute keys of the serve command.
const (
	keyAddr    = "addr"
	keyURL     = "url"
	keyNATS    = "nats"
	keyNATSURL = "nats_url"
	keyDataDir = "data_dir"
	keyAgent   = "agent"
	keyAuth    = "auth"
	keyVersion = "version"
	keySignal  = "signal"
	keyErr     = "err"
	keyTimeout = "timeout"
	keyTracing = "tracing"
)

// HTTP server timeouts (besides --header-timeout and --handshake-timeout). A WebSocket
// upgrade hijacks its connection, which clears these deadlines, so they bound only plain
// requests and handshakes.
const (
	writeTimeout = 30 * time.Second
	idleTimeout  = 2 * time.Minute
	readyTimeout = 3 * time.Second
	// closeGrace bounds the HTTP server's own shutdown beyond the drain timeout.
	closeGrace = 5 * time.Second
)

// runServe runs the gateway until SIGINT or SIGTERM and returns the exit code: 0 after a
// graceful shutdown, 1 on a runtime failure, 2 for an invalid command line.
func runServe(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseServe(args, os.LookupEnv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log, err := newLogger(cfg.logFormat, cfg.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "wsgateway:", err)
		return 2
	}

	// The first signal cancels ctx and starts the graceful shutdown; a second one exits at
	// once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		select {
		case sig := <-sigs:
			log.Info("shutting down", keySignal, sig.String())
			cancel()
		case <-watchDone:
			return
		}
		select {
		case sig := <-sigs:
			log.Warn("second signal: exiting at once", keySignal, sig.String())
			os.Exit(1)
		case <-watchDone:
		}
	}()

	if err := serve(ctx, cfg, log); err != nil {
		log.Error("wsgateway failed", keyErr, err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

// serve runs the gateway until ctx is cancelled, then shuts it down gracefully.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	g := &gateway{cfg: cfg, log: log}
	defer g.release()
	if err := g.serveDebug(); err != nil {
		return err
	}
	limit := setMemoryLimit(cfg.memoryLimit, log)
	g.budget = budget.New(memoryBudget(cfg.memoryBudget, limit))
	log.Info("memory", "limit_mib", limit>>20, "budget_mib", g.budget.Limit()>>20)
	if err := g.openStore(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // a signal during startup: nothing to drain
		}
		return err
	}
	if err := g.build(ctx); err != nil {
		return err
	}
	served := g.listen()
	go returnMemory(ctx, log, cfg.idleReturn)
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return g.shutdown(ctx, served)
}

// gateway is what serve builds, in that order: metrics, the run log, the conversation
// server and the HTTP server.
type gateway struct {
	cfg serveConfig
	log *slog.Logger

	reg    *prometheus.Registry
	m      *metrics.Metrics
	budget *budget.Budget // --memory-budget
	store  *jetstream.Store
	// threads keeps the threads, beside the run logs on store's connection.
	threads *threadstore.Store
	ledger  *ledger.Ledger // the usage ledger, on the run log's NATS
	authn   *auth.Authenticator
	tp      *sdktrace.TracerProvider // nil: tracing off
	conv    *conversation.Server
	srv     *http.Server
	ln      net.Listener
	tls     bool
	debug   *http.Server // --debug-addr; nil: off
	// abandoned is set when the shutdown exceeded --shutdown-timeout: the process then exits
	// without waiting for what is still stuck on JetStream.
	abandoned bool
}

// openStore registers the metrics and opens the run log.
func (g *gateway) openStore(ctx context.Context) error {
	g.reg = prometheus.NewRegistry()
	g.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	g.m = metrics.New(g.reg)
	g.m.SetAgent(g.cfg.agent, g.cfg.agentModel)
	g.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "wsgateway", Name: "memory_budget_used_bytes",
			Help: "Bytes charged to the memory budget: events waiting to be stored, queued frames, logs read whole."},
			func() float64 { return float64(g.budget.Used()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "wsgateway", Name: "memory_budget_limit_bytes",
			Help: "The memory budget (--memory-budget)."},
			func() float64 { return float64(g.budget.Limit()) }),
	)
	cfg := g.cfg
	store, err := jetstream.Open(ctx, jetstream.Config{
		URLs:         strings.Join(cfg.natsURLs, ","),
		CredsFile:    cfg.natsCreds,
		TLSCA:        cfg.natsTLSCA,
		TLSCert:      cfg.natsTLSCert,
		TLSKey:       cfg.natsTLSKey,
		DataDir:      cfg.dataDir,
		Replicas:     cfg.replicas,
		Streams:      cfg.streams,
		Retention:    cfg.retention,
		LeaseTTL:     cfg.leaseTTL,
		MaxTakeovers: cfg.maxTakeovers,
		Logger:       g.log,
		// The bounds of what waits to be stored (docs/SECURITY.md).
		MaxRunBacklog: cfg.maxRunBacklog,
		MaxBacklog:    cfg.maxBacklog,
		Budget:        g.budget,
		Metrics:       &jetstream.Metrics{RunReaped: g.m.RunReaped, LivenessRenewed: g.m.LivenessRenewed},
	})
	if err != nil {
		return fmt.Errorf("open the run log: %w", err)
	}
	g.store = store
	g.threads, err = threadstore.Open(ctx, store, threadstore.Config{
		Replicas:               cfg.replicas,
		Retention:              cfg.threadRetention,
		MaxThreadsPerPrincipal: cfg.maxThreads,
		Logger:                 g.log,
	})
	if err != nil {
		return fmt.Errorf("open the thread store: %w", err)
	}
	if err := g.openLedger(ctx); err != nil {
		return err
	}
	// wsgateway_jetstream_ready answers what GET /readyz answers, at each scrape.
	g.m.SetReadyCheck(func() bool {
		rctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		return g.ready(rctx) == nil
	})
	return nil
}

// ready reports whether NATS is connected and the run logs' and threads' streams answer.
func (g *gateway) ready(ctx context.Context) error {
	if err := g.store.Ready(ctx); err != nil {
		return err
	}
	return g.threads.Ready(ctx)
}

// build makes the agent, the authentication, the conversation server, the routes and the
// HTTP server.
func (g *gateway) build(ctx context.Context) error {
	cfg := g.cfg
	agent, err := newAgent(cfg)
	if err != nil {
		return err
	}
	authn, authMode, err := newAuthenticator(cfg, os.LookupEnv, g.log)
	if err != nil {
		return err
	}
	g.authn = authn
	tokens := tokensOf(authn, g.log, g.ledger)
	tlsConfig, err := newTLSConfig(cfg)
	if err != nil {
		return err
	}
	g.tls = tlsConfig != nil
	logOrigins(cfg, g.log)
	if g.tp, err = newTracerProvider(ctx, os.LookupEnv, g.log); err != nil {
		return err
	}
	var tp trace.TracerProvider // nil unless tracing is on
	if g.tp != nil {
		tp = g.tp
	}
	g.conv, err = conversation.New(conversation.Config{
		Tokens:         tokens,
		OriginPatterns: cfg.allowedOrigins,
		ReadLimit:      cfg.readLimit,
		QueueSize:      cfg.queueFrames,
		QueueBytes:     int(cfg.queueBytes),
		EarlyAborts:    cfg.earlyAborts,
		EarlyAbortTTL:  cfg.earlyAbortTTL,
		Store:          conversation.RunStore(g.store),
		Threads:        conversation.ThreadStore(g.threads),
		Agent:          agent,
		Replay:         cfg.takeover == "on" || cfg.takeover == "continue" || cfg.takeover == "auto" && cfg.agent == agentDemo,
		Continue:       cfg.takeover == "continue",
		TurnLimits:     runLimits(cfg),
		TurnContext:    clientHeaders(cfg.agentForward),
		TracerProvider: tp,

		// What the agent is given of a run's thread (THREADS.md section 5).
		AgentHistoryClient: cfg.agentHistoryClient,
		Multitask:          cfg.multitask,
		AgentHistoryBytes:  int(cfg.agentHistoryBytes),

		// Per-socket and per-principal limits (docs/SECURITY.md).
		MaxTurnsPerSocket:       cfg.maxSocketTurns,
		MaxSocketsPerPrincipal:  cfg.maxPrincipalSock,
		MaxFollowsPerSocket:     cfg.maxFollows,
		RunFrameRate:            cfg.runFrameRate,
		RunFrameBurst:           cfg.runFrameBurst,
		MaxTurnsPerPrincipal:    cfg.maxPrincipalTurns,
		TurnStartRate:           cfg.principalTurnRate,
		TurnStartBurst:          cfg.principalTurnBurst,
		MaxHydratesPerPrincipal: cfg.maxPrincipalHydrates,
		RefusalDelay:            cfg.refusalDelay,
		PrincipalLimits:         principalLimits(cfg),
		Heartbeat: heartbeat.Config{
			Interval:    cfg.heartbeat,
			IdleTimeout: cfg.idleTimeout,
		},
		Budget:  g.budget,
		Usage:   g.ledger,
		Logger:  g.log,
		Metrics: g.m,
	})
	if err != nil {
		return fmt.Errorf("conversation server: %w", err)
	}
	if g.ln, err = web.Listen(cfg.addr); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	mux, ds, err := g.routes(ctx, principalOf(tokens))
	if err != nil {
		return err
	}
	g.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: cfg.headerTimeout,
		ReadTimeout:       cfg.handshakeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		TLSConfig:         tlsConfig,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	if ds != nil {
		g.srv.RegisterOnShutdown(ds.Close) // long-polls and SSE would hold Shutdown
	}
	g.logListening(authMode)
	return nil
}

// routes returns the gateway's endpoints (README.md, Endpoints) and the Durable Streams
// handler, nil when --durable-path is empty.
func (g *gateway) routes(ctx context.Context, principal func(*http.Request) (string, error)) (*http.ServeMux, *durable.Handler, error) {
	cfg, conv, store := g.cfg, g.conv, g.store
	mux := http.NewServeMux()
	mux.Handle("GET /ws", conv)
	mux.Handle("POST /api/runs/{runId}/abort", conv.AbortHandler())
	// A server-started turn's join URL: the SSE transport's GET join, else a resume socket.
	joinPath := cfg.chatPath
	if joinPath == "" {
		joinPath = "/ws"
	}
	mux.Handle("POST /api/threads/{threadId}/runs", conv.ThreadRunsHandler(joinPath))
	mux.Handle("POST /api/threads/{threadId}/branch", conv.BranchHandler())
	mux.Handle("GET /api/threads", conv.ThreadsHandler())
	mux.Handle("GET /api/usage", conv.UsageHandler())
	mux.Handle("DELETE /api/threads/{threadId}", conv.ThreadsHandler())
	for path, framing := range map[string]conversation.Framing{cfg.chatPath: conversation.SSE, cfg.ndjsonPath: conversation.NDJSON, cfg.aguiPath: conversation.AGUI} {
		if path != "" { // the HTTP transports (PROTOCOL.md sections 5 and 6)
			for _, method := range []string{"POST ", "GET ", "DELETE "} {
				mux.Handle(method+path, conv.HTTPHandler(framing))
			}
		}
	}
	ds, err := mountDurable(ctx, mux, cfg, store, principal, g.log, func() { g.m.LimitRefused(metrics.LimitPrincipalReaders) })
	if err != nil {
		return nil, nil, err
	}
	mux.Handle("GET /", web.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{Registry: g.reg, EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := g.ready(rctx); err != nil {
			// The store's error names hosts and streams: it goes to the log, not to anyone asking.
			g.log.Warn("not ready", "err", err)
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux, ds, nil
}

// logListening logs the start line: the address, the agent, the authentication and NATS.
func (g *gateway) logListening(authMode string) {
	cfg := g.cfg
	addr := g.ln.Addr().String()
	scheme := "http://"
	if g.tls {
		scheme = "https://"
	}
	tracing := "off"
	if g.tp != nil {
		tracing = "otlp"
	}
	attrs := []any{keyAddr, addr, keyURL, scheme + addr + "/", keyAgent, cfg.agent,
		keyAuth, authMode, keyTracing, tracing, keyVersion, version}
	if len(cfg.natsURLs) == 0 {
		attrs = append(attrs, keyNATS, "embedded", keyDataDir, cfg.dataDir, keyNATSURL, g.store.ClientURL())
	} else {
		attrs = append(attrs, keyNATS, redactURLs(cfg.natsURLs))
	}
	g.log.Info("listening", attrs...)
	if a, ok := g.ln.Addr().(*net.TCPAddr); ok && web.RefusedPort(a.Port) {
		g.log.Warn("browsers and fetch refuse this port (a bad port of the Fetch standard): the chat page and the npm clients cannot reach the gateway here; choose another --addr",
			keyAddr, addr)
	}
}

// listen serves HTTP on the listener; the channel receives Serve's error.
func (g *gateway) listen() <-chan error {
	served := make(chan error, 1)
	go func() {
		if g.tls {
			served <- g.srv.ServeTLS(g.ln, "", "") // the certificate is in srv.TLSConfig
			return
		}
		served <- g.srv.Serve(g.ln)
	}()
	return served
}

// shutdown stops the gateway gracefully: it stops accepting, closes the sockets 1012 and lets
// running turns finish into their logs for the drain timeout, then aborts the rest; then it
// stops the store. served is listen's channel.
func (g *gateway) shutdown(ctx context.Context, served <-chan error) error {
	cfg, log := g.cfg, g.log
	log.Info("draining", keyTimeout, cfg.drainTimeout.String())
	httpDone := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.drainTimeout+closeGrace)
		defer cancel()
		httpDone <- g.srv.Shutdown(sctx)
	}()
	var errs []error
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.drainTimeout)
	defer cancel()
	// After the drain, the stopped turns store their terminal and close their logs, which
	// waits on JetStream: --shutdown-timeout bounds that, and the store's Close then
	// releases the leases of the logs left open, for a reaper to close.
	convDone := make(chan error, 1)
	go func() { convDone <- g.conv.Shutdown(dctx) }()
	bound := time.NewTimer(cfg.drainTimeout + cfg.shutdownTimeout)
	defer bound.Stop()
	select {
	case err := <-convDone:
		if err != nil {
			log.Warn("drain timeout: aborted the turns still running", keyErr, err)
		}
		if err := <-httpDone; err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		<-served
	case <-bound.C:
		log.Warn("shutdown timeout: exiting with turns still closing their logs", keyTimeout, cfg.shutdownTimeout.String())
		errs = append(errs, errors.New("shutdown timeout: turns still closing their logs"))
		g.abandoned = true
		g.srv.Close()
	}
	// The usage of the runs that ended last is recorded before the store closes; past the
	// shutdown timeout (JetStream unreachable) it is given a second at most, as the store.
	grace := closeGrace
	if g.abandoned {
		grace = time.Second
	}
	lctx, lcancel := context.WithTimeout(context.Background(), grace)
	if err := g.ledger.Close(lctx); err != nil {
		log.Warn("closing the usage ledger", keyErr, err)
	}
	lcancel()
	g.ledger = nil
	// The store's close releases the leases of the logs left open; past the shutdown
	// timeout (JetStream unreachable) it is given a second at most: the leases expire anyway.
	closed := make(chan error, 1)
	store := g.store
	g.store = nil // closed here, not by release
	go func() { closed <- store.Close() }()
	var closeBound <-chan time.Time
	if g.abandoned {
		closeBound = time.After(time.Second)
	}
	select {
	case err := <-closed:
		if err != nil {
			// The liveness key not deleted expires by itself: the logs left open are reaped
			// a lease TTL later. Nothing is lost, so the exit status stays that of the shutdown.
			log.Warn("closing the run log: leases left to expire", keyErr, err)
		}
	case <-closeBound:
	}
	log.Info("stopped")
	return errors.Join(errs...)
}

// release closes what serve built and shutdown did not, in reverse order; after a shutdown
// that exceeded --shutdown-timeout it leaves the conversation server alone.
func (g *gateway) release() {
	if g.conv != nil && !g.abandoned {
		g.conv.Shutdown(context.Background()) // at once after a graceful shutdown
	}
	if g.authn != nil {
		g.authn.Close()
	}
	g.ledger.Close(context.Background())
	if g.threads != nil {
		g.threads.Close()
	}
	if g.store != nil {
		g.store.Close()
	}
	flushTracing(g.tp, g.log) // the spans of the turns that ended last
	if g.debug != nil {
		g.debug.Close()
	}
}

// redactURLs joins urls with commas, passwords replaced by "xxxxx".
func redactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = s
		if u, err := url.Parse(s); err == nil {
			out[i] = u.Redacted()
		}
	}
	return strings.Join(out, ",")
}

// newAgent returns the agent --agent names.
func newAgent(cfg serveConfig) (turn.Agent, error) {
	switch cfg.agent {
	case agentDemo:
		return demo.New(), nil
	}
	return newUpstreamAgent(cfg)
}

// openLedger opens the usage ledger on the run log's NATS (docs/PROTOCOL.md, "Token usage
// and budgets").
func (g *gateway) openLedger(ctx context.Context) error {
	cfg := g.cfg
	return g.store.Provision(ctx, "the usage ledger's bucket", func(ctx context.Context) (err error) {
		g.ledger, err = ledger.New(ctx, ledger.Config{
			JetStream: g.store.JetStream(),
			Replicas:  cfg.replicas,
			Period:    cfg.tokenBudgetPeriod,
			Retention: cfg.usageRetention,
			Budget:    cfg.tokenBudget,
			Agent:     cfg.agent,
			Logger:    g.log,
		})
		if err != nil {
			err = fmt.Errorf("open the usage ledger: %w", err)
		}
		return err
	})
}

// durableCookie returns the cookie a token may come in, "" for none.
func durableCookie(cfg serveConfig) string {
	if cfg.auth == authNone || cfg.jwtCookie == "-" {
		return ""
	}
	return cfg.jwtCookie
}

// mountDurable serves the Durable Streams protocol (docs/TRANSPORTS.md) on mux, on the
// run log's NATS, unless --durable-path is empty.
func mountDurable(ctx context.Context, mux *http.ServeMux, cfg serveConfig, store *jetstream.Store, principal func(*http.Request) (string, error), log *slog.Logger, refused func()) (*durable.Handler, error) {
	if cfg.durablePath == "" {
		return nil, nil
	}
	alt := cfg.durableAltPath
	if alt == "" {
		alt = "-"
	}
	var h *durable.Handler
	err := store.Provision(ctx, "the durable streams' stream and bucket", func(ctx context.Context) (err error) {
		h, err = durable.New(ctx, durable.Config{
			Conn:            store.Conn(),
			JetStream:       store.JetStream(),
			Prefix:          cfg.durablePath,
			AltPrefix:       alt,
			Replicas:        cfg.replicas,
			Retention:       cfg.retention,
			LongPollTimeout: cfg.durableLongPoll,
			MaxBodyBytes:    cfg.durableMaxBody,
			Principal:       principal,
			Cookie:          durableCookie(cfg),
			OriginPatterns:  cfg.allowedOrigins,
			Logger:          log,
			MaxReaders:      cfg.maxPrincipalReaders,
			Refused:         refused,
			RefusalDelay:    cfg.refusalDelay,

			PrincipalReaders: principalReaders(cfg),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("durable streams: %w", err)
	}
	for _, p := range h.Patterns() {
		mux.Handle(p, h)
	}
	return h, nil
}
