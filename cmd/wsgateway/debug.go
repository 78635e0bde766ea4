package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/metrics"
	"strconv"
	"strings"
)

// debugLoopback is the host of a --debug-addr that names none (":6060" or "6060").
const debugLoopback = "127.0.0.1"

// debugAddrSetter sets --debug-addr: empty leaves the debug listener off; a bare port or
// ":port" binds it to loopback; any other host is the operator's choice.
func debugAddrSetter(c *serveConfig, v string) error {
	if v == "" {
		c.debugAddr = ""
		return nil
	}
	host, port := "", v
	if strings.Contains(v, ":") {
		var err error
		if host, port, err = net.SplitHostPort(v); err != nil {
			return errors.New("want a port or host:port, e.g. 6060, :6060 (both loopback) or 0.0.0.0:6060")
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	if host == "" {
		host = debugLoopback
	}
	c.debugAddr = net.JoinHostPort(host, port)
	return nil
}

// serveDebug listens on --debug-addr, when set, and serves Go's pprof and the runtime's
// metrics there (docs/SECURITY.md says what they expose) until release closes it.
func (g *gateway) serveDebug() error {
	if g.cfg.debugAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", g.cfg.debugAddr)
	if err != nil {
		return fmt.Errorf("debug listener: %w", err)
	}
	g.debug = &http.Server{
		Handler:           debugHandler(),
		ReadHeaderTimeout: g.cfg.headerTimeout,
		IdleTimeout:       idleTimeout,
		// No write timeout: a CPU profile or an execution trace streams for as long as asked.
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	addr := ln.Addr().String()
	g.log.Info("debug listening", keyAddr, addr, keyURL, "http://"+addr+"/debug/pprof/")
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		g.log.Warn("the debug listener is not on loopback: whoever reaches it reads the gateway's heap profile, goroutine stacks and CPU profile (docs/SECURITY.md)",
			keyAddr, addr)
	}
	go func() {
		if err := g.debug.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			g.log.Error("debug listener failed", keyErr, err)
		}
	}()
	return nil
}

// debugHandler serves net/http/pprof under /debug/pprof/ (not its cmdline, which would show
// a password given in --nats-url) and the runtime/metrics at /debug/metrics.
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	// The index and every named profile; the index's cmdline link finds no profile (404).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/metrics", writeRuntimeMetrics)
	return mux
}

// writeRuntimeMetrics writes every metric of runtime/metrics as text, one per line after its
// description: "name value", and for a histogram its count and the upper bounds of the buckets
// holding its median, 90th and 99th percentiles and its largest sample.
func writeRuntimeMetrics(w http.ResponseWriter, r *http.Request) {
	descs := metrics.All()
	samples := make([]metrics.Sample, len(descs))
	for i, d := range descs {
		samples[i].Name = d.Name
	}
	metrics.Read(samples)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	bw := bufio.NewWriter(w)
	for i, s := range samples {
		fmt.Fprintf(bw, "# %s\n", strings.ReplaceAll(descs[i].Description, "\n", " "))
		switch s.Value.Kind() {
		case metrics.KindUint64:
			fmt.Fprintf(bw, "%s %d\n", s.Name, s.Value.Uint64())
		case metrics.KindFloat64:
			fmt.Fprintf(bw, "%s %g\n", s.Name, s.Value.Float64())
		case metrics.KindFloat64Histogram:
			h := s.Value.Float64Histogram()
			var n uint64
			for _, c := range h.Counts {
				n += c
			}
			fmt.Fprintf(bw, "%s count=%d p50<=%g p90<=%g p99<=%g max<=%g\n", s.Name, n,
				bucketBound(h, n, 0.5), bucketBound(h, n, 0.9), bucketBound(h, n, 0.99), bucketBound(h, n, 1))
		default: // not supported by this runtime
			fmt.Fprintf(bw, "%s unsupported\n", s.Name)
		}
	}
	bw.Flush()
}

// bucketBound returns the upper bound of the bucket of h holding the sample of rank q·n
// (0 < q ≤ 1), n the count of h; NaN when h is empty.
func bucketBound(h *metrics.Float64Histogram, n uint64, q float64) float64 {
	if n == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range h.Counts {
		if seen += c; seen >= rank {
			return h.Buckets[i+1]
		}
	}
	return h.Buckets[len(h.Buckets)-1]
}
