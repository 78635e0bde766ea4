package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// report is the result of one load run; --json prints it as is.
type report struct {
	Label         string  `json:"label"`
	URL           string  `json:"url"`
	Sockets       int     `json:"sockets"`
	Active        int     `json:"active"`
	Turns         int     `json:"turns"`
	Tokens        int     `json:"tokens"`
	IntervalMs    int     `json:"intervalMs"`
	Drop          float64 `json:"drop"`
	Timestamps    bool    `json:"timestamps"`
	StaggerMs     float64 `json:"staggerMs"`
	EventsPerTurn int     `json:"eventsPerTurn"`

	DialSeconds    float64  `json:"dialSeconds"`
	LoadSeconds    float64  `json:"loadSeconds"`
	Events         int64    `json:"events"`
	EventsPerSec   float64  `json:"eventsPerSec"`
	TurnsCompleted int64    `json:"turnsCompleted"`
	TurnsFailed    int64    `json:"turnsFailed"`
	Resumes        int64    `json:"resumes"`
	Errors         int64    `json:"errors"`
	ErrorSample    []string `json:"errorSample,omitempty"`

	EventLatency      *percentiles `json:"eventLatencyMs,omitempty"`
	FirstEventLatency *percentiles `json:"firstEventLatencyMs,omitempty"`
	ServerDelivery    *percentiles `json:"serverDeliveryMs,omitempty"`

	ServerCPUSeconds    float64 `json:"serverCpuSeconds"`
	ServerCPUUsPerEvent float64 `json:"serverCpuUsPerEvent"`
	// ServerMinorFaults counts the server's minor page faults over the load (--pid): fresh
	// pages of memory, each costing what `wsbench page-faults` measures.
	ServerMinorFaults   int64   `json:"serverMinorFaults,omitempty"`
	ClientCPUUsPerEvent float64 `json:"clientCpuUsPerEvent"`

	RSSBaseBytes       int64   `json:"rssBaseBytes"`
	RSSIdleBytes       int64   `json:"rssIdleBytes"`
	RSSPeakBytes       int64   `json:"rssPeakBytes"`
	IdleBytesPerSocket float64 `json:"idleBytesPerSocket"`
	Goroutines         int64   `json:"goroutinesIdle"`

	Replay *replayReport `json:"replay,omitempty"`
	// IdleCurve samples the server's memory while every socket idles after the turns
	// (--idle-after).
	IdleCurve []idleSample `json:"idleCurve,omitempty"`
}

// idleSample is the server's memory Seconds after the turns ended.
type idleSample struct {
	Seconds         float64 `json:"seconds"`
	RSSBytes        int64   `json:"rssBytes"`
	RSSPerSocket    float64 `json:"rssBytesPerSocket"`
	HeapInuseBytes  int64   `json:"heapInuseBytes,omitempty"`
	StackInuseBytes int64   `json:"stackInuseBytes,omitempty"`
	Goroutines      int64   `json:"goroutines,omitempty"`
	// CPUPeakSeconds is the server's CPU in its busiest second since the previous sample
	// (with --pid).
	CPUPeakSeconds float64 `json:"cpuPeakSeconds,omitempty"`
}

// replayReport is the catch-up of completed runs read from their start.
type replayReport struct {
	Runs         int     `json:"runs"`
	Events       int64   `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"eventsPerSec"`
	// Latency is each replay's time from the start of its dial to its last event.
	Latency *percentiles `json:"latency,omitempty"`
	// FirstLatency is each replay's time from the start of its dial to its first event.
	FirstLatency *percentiles `json:"firstLatency,omitempty"`
}

// percentiles are latencies in milliseconds.
type percentiles struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

func summarize(d []time.Duration) *percentiles {
	if len(d) == 0 {
		return nil
	}
	slices.Sort(d)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(d)))) - 1
		i = min(max(i, 0), len(d)-1)
		return float64(d[i]) / float64(time.Millisecond)
	}
	return &percentiles{N: len(d), P50: at(0.50), P95: at(0.95), P99: at(0.99), P999: at(0.999), Max: at(1)}
}

func (p *percentiles) String() string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("p50 %.2f  p95 %.2f  p99 %.2f  p999 %.2f  max %.2f ms (n=%d)", p.P50, p.P95, p.P99, p.P999, p.Max, p.N)
}

func (r *report) writeTable(w io.Writer) {
	row := func(k string, format string, args ...any) {
		fmt.Fprintf(w, "%-26s "+format+"\n", append([]any{k}, args...)...)
	}
	row("server", "%s", r.Label)
	row("load", "%d sockets (%d active) × %d turns × %d events (tokens %d, interval %d ms, drop %g, timestamps %t, stagger %g ms)",
		r.Sockets, r.Active, r.Turns, r.EventsPerTurn, r.Tokens, r.IntervalMs, r.Drop, r.Timestamps, r.StaggerMs)
	row("dial", "%.2f s", r.DialSeconds)
	row("events delivered", "%d in %.2f s", r.Events, r.LoadSeconds)
	row("events/s", "%.0f", r.EventsPerSec)
	row("turns completed", "%d (failed %d)", r.TurnsCompleted, r.TurnsFailed)
	row("resumes", "%d", r.Resumes)
	row("errors", "%d", r.Errors)
	for _, e := range r.ErrorSample {
		row("", "%s", e)
	}
	row("event emit→receipt", "%s", r.EventLatency)
	row("first-event latency", "%s", r.FirstEventLatency)
	row("server emit→write", "%s", r.ServerDelivery)
	if r.ServerCPUSeconds > 0 {
		row("server CPU", "%.2f s, %.1f µs per event, %d minor page faults", r.ServerCPUSeconds, r.ServerCPUUsPerEvent, r.ServerMinorFaults)
	}
	row("client CPU", "%.1f µs per event (wsbench itself)", r.ClientCPUUsPerEvent)
	row("server RSS base/idle/peak", "%s / %s / %s", mib(r.RSSBaseBytes), mib(r.RSSIdleBytes), mib(r.RSSPeakBytes))
	row("RSS per idle socket", "%.1f KiB", r.IdleBytesPerSocket/1024)
	if r.Goroutines > 0 {
		row("server goroutines (idle)", "%d", r.Goroutines)
	}
	for _, x := range r.IdleCurve {
		row(fmt.Sprintf("idle after turns, %3.0f s", x.Seconds), "RSS %s, %.1f KiB per socket; heap %s, stacks %s, %d goroutines; busiest second %.2f s of CPU",
			mib(x.RSSBytes), x.RSSPerSocket/1024, mib(x.HeapInuseBytes), mib(x.StackInuseBytes), x.Goroutines, x.CPUPeakSeconds)
	}
	if r.Replay != nil {
		row("replay from start", "%d runs, %d events in %.2f s: %.0f events/s", r.Replay.Runs, r.Replay.Events, r.Replay.Seconds, r.Replay.EventsPerSec)
		row("replay dial → first event", "%s", r.Replay.FirstLatency)
		row("replay dial → last event", "%s", r.Replay.Latency)
	}
}

// memProbe reads a server's resident memory from /proc or from its /metrics.
type memProbe struct {
	pid        int
	metricsURL string
}

// rss returns the resident set size in bytes, or 0 when it cannot be read.
func (m *memProbe) rss(ctx context.Context) int64 {
	if m.pid > 0 {
		return procRSS(m.pid)
	}
	if m.metricsURL != "" {
		return scrapeGauge(ctx, m.metricsURL, "process_resident_memory_bytes")
	}
	return 0
}

// procRSS reads VmRSS from /proc/<pid>/status.
func procRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// procStat returns the user and system CPU time and the minor page faults of a process from
// /proc/<pid>/stat, or zeros.
func procStat(pid int) (cpu time.Duration, minorFaults int64) {
	if pid <= 0 {
		return 0, 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	// The command name (field 2) may hold spaces: count fields after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0
	}
	minflt, _ := strconv.ParseInt(f[7], 10, 64)
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks, minflt
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// selfCPU returns this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var metricsClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// scrape returns the Prometheus text exposition at u, or nil.
func scrape(ctx context.Context, u string) []byte {
	if u == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil
	}
	// Uncompressed: a compressed answer costs the server a deflate writer of about 1 MB
	// whenever its pool is empty, which a memory curve would count against the sockets.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	b, _ := io.ReadAll(resp.Body)
	return b
}

// scrapeGauge returns the value of an unlabelled sample name at u, or 0.
func scrapeGauge(ctx context.Context, u, name string) int64 {
	return scrapeGauges(ctx, u, name)[0]
}

// scrapeGauges returns the values of unlabelled samples names at u from one scrape, 0 for
// each one missing.
func scrapeGauges(ctx context.Context, u string, names ...string) []int64 {
	vals := make([]int64, len(names))
	sc := bufio.NewScanner(bytes.NewReader(scrape(ctx, u)))
	for sc.Scan() {
		for i, name := range names {
			if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				if err == nil {
					vals[i] = int64(v)
				}
			}
		}
	}
	return vals
}

// deliveryMetric is the gateway's histogram of agent emit to socket write.
const deliveryMetric = "wsgateway_turn_delivery_duration_seconds"

// histogram is a cumulative Prometheus histogram: upper bounds and counts.
type histogram struct {
	le    []float64
	count []float64
}

// scrapeHistogram sums the buckets of name over all its label sets, or returns nil.
func scrapeHistogram(ctx context.Context, u, name string) *histogram {
	body := scrape(ctx, u)
	if body == nil {
		return nil
	}
	sums := map[float64]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		leText := line[i+4:]
		leText = leText[:strings.IndexByte(leText, '"')]
		le, err1 := strconv.ParseFloat(leText, 64)
		v, err2 := strconv.ParseFloat(line[j+1:], 64)
		if err1 == nil && err2 == nil {
			sums[le] += v
		}
	}
	if len(sums) == 0 {
		return nil
	}
	h := &histogram{}
	for le := range sums {
		h.le = append(h.le, le)
	}
	slices.Sort(h.le)
	for _, le := range h.le {
		h.count = append(h.count, sums[le])
	}
	return h
}

// sub returns h minus an earlier scrape of the same histogram.
func (h *histogram) sub(before *histogram) *histogram {
	out := &histogram{le: h.le, count: slices.Clone(h.count)}
	if before != nil && len(before.count) == len(h.count) {
		for i := range out.count {
			out.count[i] -= before.count[i]
		}
	}
	return out
}

// summary estimates percentiles by linear interpolation inside the buckets.
func (h *histogram) summary() *percentiles {
	n := h.count[len(h.count)-1]
	if n <= 0 {
		return nil
	}
	at := func(q float64) float64 {
		rank := q * n
		lo, prev := 0.0, 0.0
		for i, c := range h.count {
			if c >= rank {
				hi := h.le[i]
				if math.IsInf(hi, 1) {
					return lo * 1000
				}
				f := 0.0
				if c > prev {
					f = (rank - prev) / (c - prev)
				}
				return (lo + f*(hi-lo)) * 1000
			}
			lo, prev = h.le[i], c
		}
		return lo * 1000
	}
	return &percentiles{N: int(n), P50: at(0.5), P95: at(0.95), P99: at(0.99), P999: at(0.999), Max: at(1)}
}
