// Package metrics defines the gateway's Prometheus metrics.
//
// New registers every metric on the Registerer it is given (never on a global registry) and
// returns a *Metrics whose methods record observations. A nil *Metrics is valid and records
// nothing, so packages can run without metrics in tests.
//
// Names follow wsgateway_<subsystem>_<name>_<unit>; counters end in _total, durations are
// _seconds histograms, and every label value comes from a closed set declared here (never an
// id):
//
//	wsgateway_conversation_open_sockets{kind,transport}    gauge     kind: SocketKind, transport: Transport
//	wsgateway_turn_started_total                           counter
//	wsgateway_turn_ended_total{outcome}                    counter   outcome: Outcome
//	wsgateway_turn_events_appended_total                   counter
//	wsgateway_turn_append_duration_seconds                 histogram append → stored callback
//	wsgateway_turn_delivery_duration_seconds               histogram agent emit → socket write
//	wsgateway_conversation_resumes_total{result,transport} counter   result: ResumeResult, transport: Transport
//	wsgateway_conversation_frames_dropped_total{reason}    counter   reason: DropReason
//	wsgateway_conversation_limit_refusals_total{limit}     counter   limit: Limit
//	wsgateway_jetstream_runs_reaped_total                  counter
//	wsgateway_jetstream_liveness_renewals_total            counter
//	wsgateway_jetstream_ready                              gauge     1 ready, 0 not (SetReadyCheck)
//	wsgateway_agent_time_to_first_token_seconds{agent,model} histogram run frame accepted → first delta stored
//	wsgateway_agent_inter_token_seconds{agent,model}       histogram one delta stored → the next
//	wsgateway_agent_tokens_per_second{agent,model}         histogram deltas after the first / first to last delta
//	wsgateway_agent_turn_duration_seconds{agent,model}     histogram run frame accepted → terminal stored
//	wsgateway_agent_tokens_total{agent,model,kind}         counter   kind: input, output, total
//
// The agent histograms are observed once per run by the turn that produces it (never by a
// resume, join or replay); agent and model are the gateway's --agent and --agent-model (one
// pair per process, SetAgent). Their observations carry an exemplar: the run's runId and,
// when the turn's context holds a valid OpenTelemetry span context, its trace_id.
//
// The Grafana dashboard and the Prometheus alert rules under deploy/ use these names; a test
// of package e2e fails if they name a metric a gateway does not expose.
package metrics

import (
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// SocketKind is the kind label of open sockets and HTTP streams.
type SocketKind string

// Socket kinds.
const (
	SocketConversation SocketKind = "conversation" // a conversation socket, or a POST that starts a turn
	SocketResume       SocketKind = "resume"       // a resume socket, or an HTTP stream that replays a run
)

// Transport is the transport label of open sockets and resumes.
type Transport string

// Transports: the WebSocket, and the HTTP transport with each framing.
const (
	TransportWebSocket Transport = "websocket"
	TransportSSE       Transport = "sse"
	TransportNDJSON    Transport = "ndjson"
	TransportAGUI      Transport = "agui"
)

var transports = []Transport{TransportWebSocket, TransportSSE, TransportNDJSON, TransportAGUI}

// Outcome is the outcome label of ended turns: how the turn's log was terminated.
type Outcome string

// Turn outcomes.
const (
	OutcomeCompleted         Outcome = "completed"          // the agent ended with a terminal event
	OutcomeIncomplete        Outcome = "incomplete"         // the agent ended without one
	OutcomeAgentError        Outcome = "agent_error"        // the agent failed
	OutcomeProtocolViolation Outcome = "protocol_violation" // the verifier refused an event
	OutcomeAborted           Outcome = "aborted"            // an abort frame or a resubmit
	OutcomeShutdown          Outcome = "shutdown"           // the drain timeout expired
	OutcomeLimitExceeded     Outcome = "limit_exceeded"     // the run exceeded a limit of its log
	OutcomeLogFailed         Outcome = "log_failed"         // the log refused an append or lost its lease
)

// ResumeResult is the result label of resumes (resume sockets and replaying HTTP streams).
type ResumeResult string

// Resume results, one per close of PROTOCOL.md section 3.
const (
	ResumeCompleted   ResumeResult = "completed"   // replayed up to the log's close (1000)
	ResumeBadRequest  ResumeResult = "bad_request" // 1008
	ResumeUnknownRun  ResumeResult = "unknown_run" // 4404
	ResumeFailed      ResumeResult = "failed"      // 1011
	ResumeInterrupted ResumeResult = "interrupted" // the peer left, or a shutdown or slow-consumer close
)

// DropReason is the reason label of dropped frames.
type DropReason string

// Drop reasons.
const (
	DropNotJSON      DropReason = "not_json"      // inbound text frame that is not JSON
	DropBinary       DropReason = "binary"        // inbound binary frame
	DropPingQueue    DropReason = "ping_queue"    // outbound ping skipped: the queue was full
	DropSlowConsumer DropReason = "slow_consumer" // outbound frame refused: the queue overflowed and the socket was closed
)

// Limit is the limit label of refused requests and frames: the per-socket and per-principal
// limits that refuse before anything starts (the per-run limits end turns instead, counted
// as OutcomeLimitExceeded).
type Limit string

// Limits, named as their flags.
const (
	LimitSocketTurns      Limit = "max_socket_turns"      // a run frame beyond the turns of one socket
	LimitRunFrameRate     Limit = "run_frame_rate"        // a run frame beyond the socket's rate
	LimitPrincipalSockets Limit = "max_principal_sockets" // a socket or HTTP stream beyond the principal's
	LimitFollows          Limit = "max_follows"           // a follow frame beyond the threads one socket follows
	LimitMemoryBudget     Limit = "memory_budget"         // a turn or hydrate while the memory budget admits no new work
	// The per-principal bounds across every door (docs/SECURITY.md).
	LimitPrincipalTurns    Limit = "max_principal_turns"       // a turn start beyond the principal's running turns
	LimitPrincipalTurnRate Limit = "principal_turn_rate"       // a turn start beyond the principal's rate
	LimitPrincipalHydrates Limit = "max_principal_hydrates"    // a hydrate beyond the principal's at once
	LimitPrincipalReaders  Limit = "max_principal_readers"     // a Durable Streams read beyond the principal's at once
	LimitTokenBudget       Limit = "token_budget"              // a run of a principal that used its token budget of the period
	LimitPrincipalThreads  Limit = "max_threads_per_principal" // a run that would start a thread beyond the principal's
)

// Metrics holds the gateway's collectors. Its methods are safe for concurrent use; a nil
// *Metrics records nothing.
type Metrics struct {
	openSockets     *prometheus.GaugeVec
	turnsStarted    prometheus.Counter
	turnsEnded      *prometheus.CounterVec
	eventsAppended  prometheus.Counter
	appendLatency   prometheus.Histogram
	deliveryLatency prometheus.Histogram
	resumes         *prometheus.CounterVec
	framesDropped   *prometheus.CounterVec
	limitRefusals   *prometheus.CounterVec
	runsReaped      prometheus.Counter
	takeovers       *prometheus.CounterVec
	renewals        prometheus.Counter
	ready           *readyCollector

	ttft, interToken, tokenRate, turnDuration *prometheus.HistogramVec
	tokens                                    *prometheus.CounterVec
	agent                                     atomic.Pointer[agentSeries]
}

// agentSeries is the series of the agent histograms under the current agent and model
// labels, looked up once (SetAgent) rather than at each observation: a run observes its
// inter-token gap at every delta.
type agentSeries struct {
	labels                                    prometheus.Labels
	ttft, interToken, tokenRate, turnDuration prometheus.Observer
}

// latencyBuckets span 100 µs to about 3 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 12)

// Classic buckets, not native histograms: exemplars, histogram_quantile and the alert rules
// then work on any Prometheus without its native-histogram feature flag, and the agent
// histograms' ranges are known.
var (
	// agentBuckets span 5 ms to about 80 s: a first token from a local model to a slow upstream.
	agentBuckets = prometheus.ExponentialBuckets(0.005, 2, 15)
	// turnBuckets span 50 ms to about 30 min.
	turnBuckets = prometheus.ExponentialBuckets(0.05, 2.5, 16)
	// rateBuckets span 1 to about 16000 deltas per second.
	rateBuckets = prometheus.ExponentialBuckets(1, 2, 15)
)

// New creates the gateway's metrics and registers them on reg. It panics if a metric is
// already registered on reg (a programming error, as with prometheus.MustRegister).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		openSockets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "wsgateway", Subsystem: "conversation", Name: "open_sockets",
			Help: "WebSocket connections and HTTP streams currently open, by kind and transport.",
		}, []string{"kind", "transport"}),
		turnsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "turn", Name: "started_total",
			Help: "Turns started (run.accepted appended or attempted).",
		}),
		turnsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "turn", Name: "ended_total",
			Help: "Turns ended, by outcome.",
		}, []string{"outcome"}),
		eventsAppended: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "turn", Name: "events_appended_total",
			Help: "Events stored in run logs by turns of this process.",
		}),
		appendLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "wsgateway", Subsystem: "turn", Name: "append_duration_seconds",
			Help:    "Time from handing an event to the run log to its stored acknowledgement.",
			Buckets: latencyBuckets,
		}),
		deliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "wsgateway", Subsystem: "turn", Name: "delivery_duration_seconds",
			Help:    "Time from the agent emitting an event to its envelope being written to the socket.",
			Buckets: latencyBuckets,
		}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "conversation", Name: "resumes_total",
			Help: "Finished resumes (resume sockets and replaying HTTP streams), by result and transport.",
		}, []string{"result", "transport"}),
		framesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "conversation", Name: "frames_dropped_total",
			Help: "Frames dropped, by reason.",
		}, []string{"reason"}),
		limitRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "conversation", Name: "limit_refusals_total",
			Help: "Run frames, sockets and HTTP streams refused by a per-socket or per-principal limit, by limit.",
		}, []string{"limit"}),
		ready: &readyCollector{desc: prometheus.NewDesc("wsgateway_jetstream_ready",
			"1 when NATS is connected and the run log's stream and buckets answer (as GET /readyz), else 0; asked at each scrape.",
			nil, nil)},
		runsReaped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "jetstream", Name: "runs_reaped_total",
			Help: "Runs whose producer was lost, terminated by this process's reaper.",
		}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "jetstream", Name: "takeovers_total",
			Help: "Runs whose producer died that this process took over, by how the takeover ended: continued (the replay matched the log and the run went on), diverged (replay_diverged), failed (the log failed) or refused (not taken over: the run was ended producer_lost).",
		}, []string{"outcome"}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "wsgateway", Subsystem: "jetstream", Name: "liveness_renewals_total",
			Help: "Renewals of this process's liveness key, which keeps the leases of all its runs (one per lease TTL / 5).",
		}),
	}
	agentHist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "wsgateway", Subsystem: "agent", Name: name, Help: help, Buckets: buckets,
		}, []string{"agent", "model"})
	}
	m.ttft = agentHist("time_to_first_token_seconds",
		"Time from a run frame accepted to the run's first text or tool-call delta stored, by agent and model.", agentBuckets)
	m.interToken = agentHist("inter_token_seconds",
		"Time between two consecutive text or tool-call deltas of a run stored, by agent and model.", latencyBuckets)
	m.tokenRate = agentHist("tokens_per_second",
		"Deltas of a run per second from its first to its last delta stored (runs of two deltas or more), by agent and model.", rateBuckets)
	m.turnDuration = agentHist("turn_duration_seconds",
		"Time from a run frame accepted to the run's terminal stored, by agent and model.", turnBuckets)
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "wsgateway", Subsystem: "agent", Name: "tokens_total",
		Help: "Tokens the agent reported in its runs' usage (RUN_FINISHED, RUN_ERROR), counted once per run by its producer, by agent, model and kind (input, output, total).",
	}, []string{"agent", "model", "kind"})
	m.setAgent(prometheus.Labels{"agent": "none", "model": "none"})
	reg.MustRegister(m.ttft, m.interToken, m.tokenRate, m.turnDuration, m.tokens)
	reg.MustRegister(m.openSockets, m.turnsStarted, m.turnsEnded, m.eventsAppended,
		m.appendLatency, m.deliveryLatency, m.resumes, m.framesDropped, m.limitRefusals, m.runsReaped, m.takeovers, m.renewals, m.ready)
	// Expose every closed-set series from the start, so dashboards see zeros, not gaps.
	for _, t := range transports {
		for _, k := range []SocketKind{SocketConversation, SocketResume} {
			m.openSockets.WithLabelValues(string(k), string(t))
		}
	}
	for _, o := range []Outcome{OutcomeCompleted, OutcomeIncomplete, OutcomeAgentError,
		OutcomeProtocolViolation, OutcomeAborted, OutcomeShutdown, OutcomeLimitExceeded, OutcomeLogFailed} {
		m.turnsEnded.WithLabelValues(string(o))
	}
	for _, r := range []ResumeResult{ResumeCompleted, ResumeBadRequest, ResumeUnknownRun,
		ResumeFailed, ResumeInterrupted} {
		for _, t := range transports {
			m.resumes.WithLabelValues(string(r), string(t))
		}
	}
	for _, d := range []DropReason{DropNotJSON, DropBinary, DropPingQueue, DropSlowConsumer} {
		m.framesDropped.WithLabelValues(string(d))
	}
	for _, l := range []Limit{LimitSocketTurns, LimitRunFrameRate, LimitPrincipalSockets, LimitFollows, LimitMemoryBudget,
		LimitPrincipalTurns, LimitPrincipalTurnRate, LimitPrincipalHydrates, LimitPrincipalReaders, LimitTokenBudget} {
		m.limitRefusals.WithLabelValues(string(l))
	}
	for _, o := range []TakeoverOutcome{TakeoverContinued, TakeoverDiverged, TakeoverFailed, TakeoverRefused} {
		m.takeovers.WithLabelValues(string(o))
	}
	return m
}

// SocketOpened counts an open socket or HTTP stream of kind k over transport t.
func (m *Metrics) SocketOpened(t Transport, k SocketKind) {
	if m != nil {
		m.openSockets.WithLabelValues(string(k), string(t)).Inc()
	}
}

// SocketClosed uncounts an open socket or HTTP stream of kind k over transport t.
func (m *Metrics) SocketClosed(t Transport, k SocketKind) {
	if m != nil {
		m.openSockets.WithLabelValues(string(k), string(t)).Dec()
	}
}

// TurnStarted counts a started turn.
func (m *Metrics) TurnStarted() {
	if m != nil {
		m.turnsStarted.Inc()
	}
}

// TurnEnded counts an ended turn with its outcome.
func (m *Metrics) TurnEnded(o Outcome) {
	if m != nil {
		m.turnsEnded.WithLabelValues(string(o)).Inc()
	}
}

// EventAppended counts one stored event and observes d, its append latency.
func (m *Metrics) EventAppended(d time.Duration) {
	if m != nil {
		m.eventsAppended.Inc()
		m.appendLatency.Observe(d.Seconds())
	}
}

// Delivered observes d, the latency from agent emit to socket write.
func (m *Metrics) Delivered(d time.Duration) {
	if m != nil {
		m.deliveryLatency.Observe(d.Seconds())
	}
}

// Resume counts a finished resume over transport t with its result.
func (m *Metrics) Resume(t Transport, r ResumeResult) {
	if m != nil {
		m.resumes.WithLabelValues(string(r), string(t)).Inc()
	}
}

// FrameDropped counts a dropped frame.
func (m *Metrics) FrameDropped(r DropReason) {
	if m != nil {
		m.framesDropped.WithLabelValues(string(r)).Inc()
	}
}

// RunReaped counts a run terminated by the reaper. Its signature fits a reaper hook.
func (m *Metrics) RunReaped() {
	if m != nil {
		m.runsReaped.Inc()
	}
}

// TakeoverOutcome is how a takeover of a run ended (wsgateway_jetstream_takeovers_total).
type TakeoverOutcome string

// Takeover outcomes.
const (
	TakeoverContinued TakeoverOutcome = "continued"
	TakeoverDiverged  TakeoverOutcome = "diverged"
	TakeoverFailed    TakeoverOutcome = "failed"
	TakeoverRefused   TakeoverOutcome = "refused"
)

// TakeoverEnded counts a takeover that ended with outcome o.
func (m *Metrics) TakeoverEnded(o TakeoverOutcome) {
	if m != nil {
		m.takeovers.WithLabelValues(string(o)).Inc()
	}
}

// LivenessRenewed counts a renewal of the liveness key. Its signature fits a store hook.
func (m *Metrics) LivenessRenewed() {
	if m != nil {
		m.renewals.Inc()
	}
}

// LimitRefused counts a request or frame refused by limit l.
func (m *Metrics) LimitRefused(l Limit) {
	if m != nil {
		m.limitRefusals.WithLabelValues(string(l)).Inc()
	}
}

// SetReadyCheck sets the check behind wsgateway_jetstream_ready, called at each scrape; it
// must return within the scrape timeout. Until it is set the gauge is not exposed.
func (m *Metrics) SetReadyCheck(check func() bool) {
	if m != nil {
		m.ready.check.Store(&check)
	}
}

// readyCollector exposes wsgateway_jetstream_ready from a check run at scrape time, so the
// value is never older than the scrape and nothing polls between scrapes.
type readyCollector struct {
	desc  *prometheus.Desc
	check atomic.Pointer[func() bool]
}

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.check.Load()
	if f == nil {
		return
	}
	v := 0.0
	if (*f)() {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v)
}

// SetAgent sets the agent and model labels of the agent histograms ("" agent or model:
// "none"), and drops what was observed under the previous ones. Call it before the first turn.
func (m *Metrics) SetAgent(agent, model string) {
	if m == nil {
		return
	}
	if agent == "" {
		agent = "none"
	}
	if model == "" {
		model = "none"
	}
	for _, h := range []*prometheus.HistogramVec{m.ttft, m.interToken, m.tokenRate, m.turnDuration} {
		h.Reset()
	}
	m.setAgent(prometheus.Labels{"agent": agent, "model": model})
	m.tokens.Reset()
	for _, k := range tokenKinds {
		m.tokens.WithLabelValues(agent, model, k)
	}
}

// setAgent makes l the agent histograms' labels: their series under l exist from now on,
// exposed from the start as the closed-set series.
func (m *Metrics) setAgent(l prometheus.Labels) {
	m.agent.Store(&agentSeries{labels: l, ttft: m.ttft.With(l), interToken: m.interToken.With(l),
		tokenRate: m.tokenRate.With(l), turnDuration: m.turnDuration.With(l)})
}

// RunLatency is what a turn measured of its run, for the agent histograms.
type RunLatency struct {
	FirstToken time.Duration // accepted → first delta stored; 0: no delta
	Deltas     int           // deltas stored
	Span       time.Duration // first → last delta stored
	Duration   time.Duration // accepted → terminal stored
	// Exemplar labels the observations (runId, trace_id); nil: none.
	Exemplar prometheus.Labels
}

// RunMeasured observes a run's latencies, once per run, by its producer.
func (m *Metrics) RunMeasured(r RunLatency) {
	if m == nil {
		return
	}
	a := m.agent.Load()
	if r.Deltas > 0 {
		observe(a.ttft, r.FirstToken.Seconds(), r.Exemplar)
	}
	if r.Deltas > 1 && r.Span > 0 {
		observe(a.tokenRate, float64(r.Deltas-1)/r.Span.Seconds(), r.Exemplar)
	}
	observe(a.turnDuration, r.Duration.Seconds(), r.Exemplar)
}

// TokenGap observes d, the time between two consecutive deltas of a run stored, by its
// producer; exemplar as RunLatency's, nil for none. An exemplar costs allocations at every
// observation that carries one, and a bucket shows the last it got: a run gives it with its
// slowest gap so far only (turn).
func (m *Metrics) TokenGap(d time.Duration, exemplar prometheus.Labels) {
	if m != nil {
		observe(m.agent.Load().interToken, d.Seconds(), exemplar)
	}
}

// observe observes v in o, with exemplar unless it is empty.
func observe(o prometheus.Observer, v float64, exemplar prometheus.Labels) {
	if eo, ok := o.(prometheus.ExemplarObserver); ok && len(exemplar) > 0 {
		eo.ObserveWithExemplar(v, exemplar)
		return
	}
	o.Observe(v)
}

// Exemplar returns the exemplar labels of a run: run_id, and trace_id when traceID is not
// "". A label that would take the exemplar past the 128 runes OpenMetrics allows is left out
// (a runId is the client's choice; a trace id is 32 runes).
func Exemplar(runID, traceID string) prometheus.Labels {
	l := prometheus.Labels{}
	n := 0
	if traceID != "" {
		l["trace_id"] = traceID
		n = len("trace_id") + utf8.RuneCountInString(traceID)
	}
	if n+len("run_id")+utf8.RuneCountInString(runID) <= prometheus.ExemplarMaxRunes {
		l["run_id"] = runID
	}
	return l
}

var tokenKinds = []string{"input", "output", "total"}

// Usage is the token usage a run reported, summed over its usage entries.
type Usage struct {
	Input  int64 `json:"inputTokens"`
	Output int64 `json:"outputTokens"`
	Total  int64 `json:"totalTokens"`
}

// Add returns u plus v.
func (u Usage) Add(v Usage) Usage {
	return Usage{Input: u.Input + v.Input, Output: u.Output + v.Output, Total: u.Total + v.Total}
}

// TokensUsed counts the usage of one run, once, by its producer.
func (m *Metrics) TokensUsed(u Usage) {
	if m == nil {
		return
	}
	l := m.agent.Load().labels
	for i, n := range []int64{u.Input, u.Output, u.Total} {
		if n > 0 {
			m.tokens.WithLabelValues(l["agent"], l["model"], tokenKinds[i]).Add(float64(n))
		}
	}
}
