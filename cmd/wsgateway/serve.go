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

	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/durable"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/turn"
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
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m := metrics.New(reg)

	store, err := jetstream.Open(ctx, jetstream.Config{
		URLs:      strings.Join(cfg.natsURLs, ","),
		CredsFile: cfg.natsCreds,
		TLSCA:     cfg.natsTLSCA,
		TLSCert:   cfg.natsTLSCert,
		TLSKey:    cfg.natsTLSKey,
		DataDir:   cfg.dataDir,
		Replicas:  cfg.replicas,
		Retention: cfg.retention,
		LeaseTTL:  cfg.leaseTTL,
		Logger:    log,
		// The bounds of what waits to be stored (README "Security").
		MaxRunBacklog: cfg.maxRunBacklog,
		MaxBacklog:    cfg.maxBacklog,
		Metrics:       &jetstream.Metrics{RunReaped: m.RunReaped},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // a signal during startup: nothing to drain
		}
		return fmt.Errorf("open the run log: %w", err)
	}
	// abandoned is set when the shutdown exceeded --shutdown-timeout: the process then exits
	// without waiting for what is still stuck on JetStream.
	abandoned := false
	defer func() {
		if !abandoned {
			store.Close()
		}
	}()
	// wsgateway_jetstream_ready answers what GET /readyz answers, at each scrape.
	m.SetReadyCheck(func() bool {
		rctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		return store.Ready(rctx) == nil
	})

	agent, err := newAgent(cfg)
	if err != nil {
		return err
	}
	authn, authMode, err := newAuthenticator(cfg, os.LookupEnv, log)
	if err != nil {
		return err
	}
	if authn != nil {
		defer authn.Close()
	}
	tokens := tokensOf(authn, log)
	tlsConfig, err := newTLSConfig(cfg)
	if err != nil {
		return err
	}
	logOrigins(cfg, log)
	conv, err := conversation.New(conversation.Config{
		Tokens:         tokens,
		OriginPatterns: cfg.allowedOrigins,
		ReadLimit:      cfg.readLimit,
		QueueSize:      cfg.queueFrames,
		QueueBytes:     int(cfg.queueBytes),
		EarlyAborts:    cfg.earlyAborts,
		EarlyAbortTTL:  cfg.earlyAbortTTL,
		Store:          store,
		Agent:          agent,
		TurnLimits:     runLimits(cfg),
		TurnContext:    clientHeaders(cfg.agentForward),

		// Per-socket and per-principal limits (README "Security").
		MaxTurnsPerSocket:      cfg.maxSocketTurns,
		MaxSocketsPerPrincipal: cfg.maxPrincipalSock,
		RunFrameRate:           cfg.runFrameRate,
		RunFrameBurst:          cfg.runFrameBurst,
		Heartbeat: heartbeat.Config{
			Interval:    cfg.heartbeat,
			IdleTimeout: cfg.idleTimeout,
		},
		Logger:  log,
		Metrics: m,
	})
	if err != nil {
		return fmt.Errorf("conversation server: %w", err)
	}
	// Shut down on every path; after a graceful shutdown below this returns at once, and
	// after one that exceeded --shutdown-timeout it is skipped.
	defer func() {
		if !abandoned {
			conv.Shutdown(context.Background())
		}
	}()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ws", conv)
	mux.Handle("POST /api/runs/{runId}/abort", conv.AbortHandler())
	for path, framing := range map[string]conversation.Framing{cfg.chatPath: conversation.SSE, cfg.ndjsonPath: conversation.NDJSON, cfg.aguiPath: conversation.AGUI} {
		if path != "" { // the HTTP transports (PROTOCOL.md sections 5 and 6)
			for _, method := range []string{"POST ", "GET ", "DELETE "} {
				mux.Handle(method+path, conv.HTTPHandler(framing))
			}
		}
	}
	ds, err := mountDurable(ctx, mux, cfg, store, principalOf(tokens), log)
	if err != nil {
		return err
	}
	mux.Handle("GET /", web.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := store.Ready(rctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: cfg.headerTimeout,
		ReadTimeout:       cfg.handshakeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		TLSConfig:         tlsConfig,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if ds != nil {
		srv.RegisterOnShutdown(ds.Close) // long-polls and SSE would hold Shutdown
	}

	addr := ln.Addr().String()
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
	}
	attrs := []any{keyAddr, addr, keyURL, scheme + addr + "/", keyAgent, cfg.agent,
		keyAuth, authMode, keyVersion, version}
	if len(cfg.natsURLs) == 0 {
		attrs = append(attrs, keyNATS, "embedded", keyDataDir, cfg.dataDir, keyNATSURL, store.ClientURL())
	} else {
		attrs = append(attrs, keyNATS, redactURLs(cfg.natsURLs))
	}
	log.Info("listening", attrs...)

	served := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			served <- srv.ServeTLS(ln, "", "") // the certificate is in srv.TLSConfig
			return
		}
		served <- srv.Serve(ln)
	}()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	// Graceful shutdown: stop accepting; close the sockets 1012 and let running turns finish
	// into their logs for the drain timeout, then abort the rest; then stop the store.
	log.Info("draining", keyTimeout, cfg.drainTimeout.String())
	httpDone := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.drainTimeout+closeGrace)
		defer cancel()
		httpDone <- srv.Shutdown(sctx)
	}()
	var errs []error
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.drainTimeout)
	defer cancel()
	// After the drain, the stopped turns store their terminal and close their logs, which
	// waits on JetStream: --shutdown-timeout bounds that, and the store's Close then
	// releases the leases of the logs left open, for a reaper to close.
	convDone := make(chan error, 1)
	go func() { convDone <- conv.Shutdown(dctx) }()
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
		abandoned = true
		srv.Close()
	}
	// The store's close releases the leases of the logs left open; past the shutdown
	// timeout (JetStream unreachable) it is given a second at most: the leases expire anyway.
	closed := make(chan error, 1)
	go func() { closed <- store.Close() }()
	var closeBound <-chan time.Time
	if abandoned {
		closeBound = time.After(time.Second)
	}
	select {
	case err := <-closed:
		if err != nil {
			errs = append(errs, fmt.Errorf("close the run log: %w", err))
		}
	case <-closeBound:
	}
	log.Info("stopped")
	return errors.Join(errs...)
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

// mountDurable serves the Durable Streams protocol (README "Durable Streams") on mux, on the
// run log's NATS, unless --durable-path is empty.
func mountDurable(ctx context.Context, mux *http.ServeMux, cfg serveConfig, store *jetstream.Store, principal func(*http.Request) (string, error), log *slog.Logger) (*durable.Handler, error) {
	if cfg.durablePath == "" {
		return nil, nil
	}
	alt := cfg.durableAltPath
	if alt == "" {
		alt = "-"
	}
	h, err := durable.New(ctx, durable.Config{
		Conn:            store.Conn(),
		JetStream:       store.JetStream(),
		Prefix:          cfg.durablePath,
		AltPrefix:       alt,
		Replicas:        cfg.replicas,
		Retention:       cfg.retention,
		LongPollTimeout: cfg.durableLongPoll,
		MaxBodyBytes:    cfg.durableMaxBody,
		Principal:       principal,
		Logger:          log,
	})
	if err != nil {
		return nil, fmt.Errorf("durable streams: %w", err)
	}
	for _, p := range h.Patterns() {
		mux.Handle(p, h)
	}
	return h, nil
}
