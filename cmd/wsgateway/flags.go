package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wsgateway/wsgateway/auth"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/durable"
	"github.com/wsgateway/wsgateway/protocol"
)

// errUsage marks a command line that cannot run; the message says why.
var errUsage = errors.New("wsgateway: invalid command line")

// Agent names accepted by --agent.
const (
	agentDemo   = "demo"
	agentAGUI   = "agui"
	agentOpenAI = "openai"
)

// maxReplicas is the largest replica count JetStream accepts for a stream.
// maxStreams bounds --streams (as the run log does).
const maxStreams = 64

const maxReplicas = 5

// serveConfig is the validated command line of `wsgateway serve`.
type serveConfig struct {
	addr            string
	dataDir         string
	natsURLs        []string // empty: embedded server
	natsCreds       string
	natsTLSCA       string
	natsTLSCert     string
	natsTLSKey      string
	replicas        int
	streams         int
	agent           string
	agentURL        string
	heartbeat       time.Duration
	idleTimeout     time.Duration
	leaseTTL        time.Duration
	takeover        string // auto, on or off
	maxTakeovers    int
	retention       time.Duration
	threadRetention time.Duration
	maxThreads      int // --max-threads-per-principal; 0: no bound
	drainTimeout    time.Duration
	// shutdownTimeout bounds the stop after the drain: the turns' terminals and log closes,
	// the sockets' last frames and the store's close.
	shutdownTimeout time.Duration
	chatPath        string // SSE transport; empty: off
	ndjsonPath      string // NDJSON transport; empty: off
	aguiPath        string // AG-UI transport; empty: off
	logFormat       string
	logLevel        string
	debugAddr       string // pprof and runtime metrics; empty: off

	// Security (docs/SECURITY.md).
	auth             string // authNone or authJWT
	jwtSecretEnv     string // name of the environment variable holding the HS256 secret
	jwtKeyFile       string
	jwtJWKSFile      string
	jwtJWKSURL       string
	jwtJWKSCA        string
	jwtJWKSRefresh   time.Duration
	jwtAudience      string
	jwtIssuer        string
	jwtCookie        string
	jwtQueryParam    string
	allowedOrigins   []string // empty: same origin only
	tlsCert          string
	tlsKey           string
	readLimit        int64
	headerTimeout    time.Duration
	handshakeTimeout time.Duration
	maxRunEvents     int
	maxRunBytes      int64
	maxEventBytes    int64
	maxRunBacklog    int64
	maxBacklog       int64
	agentIdleTimeout time.Duration
	queueFrames      int
	queueBytes       int64
	earlyAborts      int
	earlyAbortTTL    time.Duration
	maxSocketTurns   int
	maxPrincipalSock int
	maxFollows       int
	runFrameRate     float64
	refusalDelay     time.Duration // -1: none
	runFrameBurst    int
	// The per-principal bounds across every door (docs/SECURITY.md).
	maxPrincipalTurns    int
	principalTurnRate    float64
	principalTurnBurst   int
	maxPrincipalHydrates int
	maxPrincipalReaders  int
	principalLimits      map[string]principalLimit // --principal-limit, repeatable

	// The agui and openai agents (docs/AGENTS.md).
	agentHeader         http.Header // --agent-header, repeatable
	agentForward        []string    // canonical header names
	agentConnectTimeout time.Duration
	agentFirstEvent     time.Duration
	agentGapTimeout     time.Duration
	agentTurnTimeout    time.Duration
	agentModel          string
	agentAPIKeyEnv      string
	agentAPIKey         string // the value of agentAPIKeyEnv; never logged

	// Durable Streams (docs/TRANSPORTS.md).
	durablePath     string // empty: off
	durableAltPath  string // the TanStack adapter's shape; empty: off
	durableLongPoll time.Duration
	durableMaxBody  int64
	// idleReturn: an idle gateway returns the heap its collections free to the system
	// (--idle-memory return).
	idleReturn bool
	// memoryLimit is the Go runtime's soft memory limit (--memory-limit): memoryAuto (from
	// the container's cgroup limit), memoryOff, or a size. memoryBudget is the gateway's
	// memory budget (--memory-budget): memoryAuto (from the memory limit) or a size.
	memoryLimit  int64
	memoryBudget int64

	// The usage ledger and token budgets (docs/SECURITY.md, "Token budgets").
	tokenBudget       int64
	tokenBudgetPeriod time.Duration
	usageRetention    time.Duration

	// agent history (--agent-history, --agent-history-bytes): only what a run posted, or
	// the thread's transcript cut to a byte budget (0: none).
	agentHistoryClient bool
	agentHistoryBytes  int64
	// multitask (--multitask): the multitaskStrategy of a run that names none.
	multitask string
}

// Values of --agent-history.
const (
	historyThread = "thread"
	historyClient = "client"
)

// Values of --memory-limit and --memory-budget besides sizes.
const (
	memoryAuto int64 = 0
	memoryOff  int64 = -1
)

// Modes of --idle-memory.
const (
	idleMemoryKeep   = "keep"
	idleMemoryReturn = "return"
)

// Modes of --auth.
const (
	authNone = "none"
	authJWT  = "jwt"
)

// serveFlag describes one flag of `wsgateway serve`: the help text, the default, and the
// environment variable that sets it when the flag is absent.
type serveFlag struct {
	name  string
	def   string
	usage string
	set   func(cfg *serveConfig, value string) error
}

// env returns the environment variable of a flag: --idle-timeout ↔ WSGATEWAY_IDLE_TIMEOUT.
func (f serveFlag) env() string {
	return "WSGATEWAY_" + strings.ToUpper(strings.ReplaceAll(f.name, "-", "_"))
}

var serveFlags = []serveFlag{
	{"addr", "127.0.0.1:8080", "HTTP listen address (host:port; port 0 picks a free port that browsers accept)", func(c *serveConfig, v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return fmt.Errorf("want host:port, e.g. 127.0.0.1:8080 or :8080")
		}
		c.addr = v
		return nil
	}},
	{"data-dir", "./data", "directory where the embedded NATS server stores its JetStream data", func(c *serveConfig, v string) error {
		if v == "" {
			return errors.New("must not be empty")
		}
		c.dataDir = v
		return nil
	}},
	{"nats-url", "", "external NATS servers, comma-separated (e.g. nats://n1:4222,nats://n2:4222); empty runs an embedded server", func(c *serveConfig, v string) error {
		c.natsURLs = nil
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			u, err := url.Parse(s)
			if err != nil || u.Host == "" {
				return fmt.Errorf("%q is not a URL like nats://host:4222", s)
			}
			switch u.Scheme {
			case "nats", "tls", "ws", "wss":
			default:
				return fmt.Errorf("%q: scheme must be nats, tls, ws or wss", s)
			}
			c.natsURLs = append(c.natsURLs, s)
		}
		return nil
	}},
	{"nats-creds", "", "NATS credentials file (with --nats-url)", stringSetter(func(c *serveConfig) *string { return &c.natsCreds })},
	{"nats-tls-ca", "", "PEM file of a CA to trust for NATS TLS (with --nats-url)", stringSetter(func(c *serveConfig) *string { return &c.natsTLSCA })},
	{"nats-tls-cert", "", "PEM client certificate for NATS TLS (with --nats-tls-key)", stringSetter(func(c *serveConfig) *string { return &c.natsTLSCert })},
	{"nats-tls-key", "", "PEM client key for NATS TLS (with --nats-tls-cert)", stringSetter(func(c *serveConfig) *string { return &c.natsTLSKey })},
	{"replicas", "1", "replicas of the run-log stream and its buckets (1 to 5; more than 1 needs a NATS cluster)", intRange(maxReplicas, func(c *serveConfig) *int { return &c.replicas })},
	{"streams", "1", "JetStream streams new runs are spread over by a hash of their runId (1 to 64), so that a cluster spreads their leaders and writes over its nodes; a run stays on the stream it was created on, so changing it between restarts loses no run", intRange(maxStreams, func(c *serveConfig) *int { return &c.streams })},
	{"agent", agentDemo, "the agent that answers: demo (built in), agui (an AG-UI server over HTTP, --agent-url) or openai (a Chat Completions server, --agent-url and --agent-model)", func(c *serveConfig, v string) error {
		switch v {
		case agentDemo, agentAGUI, agentOpenAI:
		default:
			return fmt.Errorf("unknown agent %q; want %s, %s or %s", v, agentDemo, agentAGUI, agentOpenAI)
		}
		c.agent = v
		return nil
	}},
	{"agent-url", "", "agui: the endpoint turns are POSTed to; openai: the API base (https://api.openai.com/v1, http://127.0.0.1:11434/v1)", func(c *serveConfig, v string) error {
		if v == "" {
			c.agentURL = ""
			return nil
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%q is not an http(s) URL", v)
		}
		c.agentURL = v
		return nil
	}},
	{"agent-header", "", "header sent with every upstream request of the agui or openai agent, \"Name: value\"; repeat the flag for more (in the environment variable: one per line)", headerSetter},
	{"agent-forward-headers", "", "headers of the client's WebSocket handshake copied onto the upstream request, comma-separated (e.g. Authorization,Cookie)", forwardSetter},
	{"agent-connect-timeout", "10s", "time the agui or openai agent has to connect to its upstream (TCP and TLS)", durationSetter(func(c *serveConfig) *time.Duration { return &c.agentConnectTimeout })},
	{"agent-first-event-timeout", "60s", "time from sending a turn upstream to its first event; then the turn ends with RUN_ERROR agent_error", durationSetter(func(c *serveConfig) *time.Duration { return &c.agentFirstEvent })},
	{"agent-gap-timeout", "60s", "longest silence of an upstream stream after its first event (keep-alive comments count); then RUN_ERROR agent_error", durationSetter(func(c *serveConfig) *time.Duration { return &c.agentGapTimeout })},
	{"agent-turn-timeout", "30m", "longest upstream request of one turn; then RUN_ERROR agent_error", durationSetter(func(c *serveConfig) *time.Duration { return &c.agentTurnTimeout })},
	{"agent-model", "", "model of the openai agent's requests (e.g. gpt-4o-mini, llama3.2)", stringSetter(func(c *serveConfig) *string { return &c.agentModel })},
	{"agent-api-key-env", "OPENAI_API_KEY", "name of the environment variable holding the openai agent's API key (never the key itself); unset or empty: no key", func(c *serveConfig, v string) error {
		if v == "" || strings.ContainsAny(v, "= \t\r\n") {
			return errors.New("want the name of an environment variable, such as OPENAI_API_KEY")
		}
		c.agentAPIKeyEnv = v
		return nil
	}},
	{"agent-history", historyThread, "what the agent is given as a run's messages: thread (the thread's transcript, with the replies and tool results of earlier runs, merged with what the run posted) or client (only what the run posted, for apps that manage history themselves)", func(c *serveConfig, v string) error {
		if v != historyThread && v != historyClient {
			return fmt.Errorf("want %s or %s", historyThread, historyClient)
		}
		c.agentHistoryClient = v == historyClient
		return nil
	}},
	{"agent-history-bytes", "512KiB", "bytes of JSON of the thread's messages the agent is given: its leading system and developer messages, then the newest messages that fit, the newest one always; the cut is logged at debug level; 0: no bound", sizeSetter(0, func(c *serveConfig) *int64 { return &c.agentHistoryBytes })},
	{"multitask", conversation.MultitaskEnqueue, "what a run that names no multitaskStrategy does while another run of its thread is active: enqueue (it is accepted at once and starts when the earlier runs have ended, in order), interrupt (as enqueue, and the running ones end RUN_ERROR code interrupted, their partial replies kept), rollback (as interrupt, and their messages leave the thread), reject (it is refused, RUN_ERROR code thread_busy, HTTP 409) or concurrent (it starts beside them)", func(c *serveConfig, v string) error {
		if !slices.Contains(protocol.MultitaskStrategies, v) {
			return fmt.Errorf("want one of %s", strings.Join(protocol.MultitaskStrategies, ", "))
		}
		c.multitask = v
		return nil
	}},
	{"heartbeat", "30s", "interval of the {\"type\":\"ping\"} frames and WebSocket pings", durationSetter(func(c *serveConfig) *time.Duration { return &c.heartbeat })},
	{"idle-timeout", "5m", "close a socket with no inbound frame for this long, unless a turn it started is still producing or it follows a thread", durationSetter(func(c *serveConfig) *time.Duration { return &c.idleTimeout })},
	{"idle-memory", idleMemoryReturn, "what an idle gateway does with the heap its idle collections free: return it (to the system: 1 to 3 KiB less per idle socket, while the next turns pay a page fault for every page they grow into again) or keep it (for the next turns to reuse)", func(c *serveConfig, v string) error {
		if v != idleMemoryKeep && v != idleMemoryReturn {
			return fmt.Errorf("want %s or %s", idleMemoryKeep, idleMemoryReturn)
		}
		c.idleReturn = v == idleMemoryReturn
		return nil
	}},
	{"memory-limit", "auto", "the Go runtime's soft memory limit: auto (90% of the container's cgroup memory limit when there is one; GOMEMLIMIT, when set, wins), off (the runtime's own: GOMEMLIMIT or none) or a size such as 2GiB", memorySetter(true, func(c *serveConfig) *int64 { return &c.memoryLimit })},
	{"memory-budget", "auto", "bytes of memory clients and agents may make the gateway hold at once: events waiting to be stored, frames queued to sockets and HTTP streams, logs read whole; at half of it agents and replays wait, past three quarters new turns and hydrates are refused, at it a socket already behind is closed 1013. auto: a quarter of the memory limit, 128MiB without one", memorySetter(false, func(c *serveConfig) *int64 { return &c.memoryBudget })},
	{"lease-ttl", "15s", "producer lease; a run whose gateway died is taken over by another (--takeover), or ended RUN_ERROR producer_lost, after about this long", durationSetter(func(c *serveConfig) *time.Duration { return &c.leaseTTL })},
	{"takeover", "auto", "a run whose gateway died is taken over by a live gateway, which runs the agent again with the run's input and appends only what follows the stored events (a replay that disagrees with them ends RUN_ERROR replay_diverged): on (the agent replays: the same input gives the same events), continue (best effort, for agents that do not replay, as --agent openai: the agent is given the reply stored so far as the last assistant message, and what it answers is appended after it), off (such a run ends RUN_ERROR producer_lost) or auto (on for --agent demo, off otherwise)", func(c *serveConfig, v string) error {
		switch v {
		case "auto", "on", "off", "continue":
		default:
			return fmt.Errorf("want auto, on, continue or off")
		}
		c.takeover = v
		return nil
	}},
	{"max-takeovers", "3", "takeovers of one run (1 to 100); a run whose gateway dies again after as many ends RUN_ERROR producer_lost", intRange(100, func(c *serveConfig) *int { return &c.maxTakeovers })},
	{"retention", "24h", "how long run logs are kept (resumable)", durationSetter(func(c *serveConfig) *time.Duration { return &c.retention })},
	{"thread-retention", "720h", "how long a thread (its transcript and list of runs) is kept after its last turn, independently of the runs' logs", durationSetter(func(c *serveConfig) *time.Duration { return &c.threadRetention })},
	{"max-threads-per-principal", "10000", "threads one principal may have, cluster-wide (a bound of the thread store, counted when a run would start another, each gateway's count kept 5 s with its own creations and deletions; runs started at the same moment, or on another gateway within those 5 s, may pass it together); a run that would start one more ends RUN_ERROR limit_exceeded after run.accepted; 0: no bound", func(c *serveConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number, 0 for no bound")
		}
		c.maxThreads = n
		return nil
	}},
	{"drain-timeout", "10s", "on SIGTERM/SIGINT, how long running turns may finish before they are aborted", durationSetter(func(c *serveConfig) *time.Duration { return &c.drainTimeout })},
	{"shutdown-timeout", "15s", "after --drain-timeout, how long the stopped turns may take to store their terminal and close their logs before the gateway exits anyway (their leases released: a reaper closes those logs)", durationSetter(func(c *serveConfig) *time.Duration { return &c.shutdownTimeout })},
	{"auth", authNone, "authentication of /ws: none (development: every client is one principal) or jwt (a JSON Web Token; see --jwt-*)", func(c *serveConfig, v string) error {
		if v != authNone && v != authJWT {
			return fmt.Errorf("want %s or %s", authNone, authJWT)
		}
		c.auth = v
		return nil
	}},
	{"jwt-secret-env", "", "name of the environment variable holding the HS256 secret (at least 32 bytes; never the secret itself)", stringSetter(func(c *serveConfig) *string { return &c.jwtSecretEnv })},
	{"jwt-key-file", "", "PEM file of the public keys that verify tokens (RSA: RS256; EC P-256: ES256, P-384: ES384)", stringSetter(func(c *serveConfig) *string { return &c.jwtKeyFile })},
	{"jwt-jwks-file", "", "JWK Set file (RFC 7517) of the public keys that verify tokens", stringSetter(func(c *serveConfig) *string { return &c.jwtJWKSFile })},
	{"jwt-jwks-url", "", "https:// URL of the identity provider's JWK Set (its jwks_uri), fetched at start, every --jwt-jwks-refresh and for a token of an unknown kid (at most once a minute); the last good set is kept through an outage", func(c *serveConfig, v string) error {
		if v != "" {
			if u, err := url.Parse(v); err != nil || u.Scheme != "https" || u.Host == "" {
				return errors.New("want an https:// URL")
			}
		}
		c.jwtJWKSURL = v
		return nil
	}},
	{"jwt-jwks-ca", "", "PEM file of CAs to trust for --jwt-jwks-url besides the system's", stringSetter(func(c *serveConfig) *string { return &c.jwtJWKSCA })},
	{"jwt-jwks-refresh", "15m", "period of the scheduled fetch of --jwt-jwks-url", durationSetter(func(c *serveConfig) *time.Duration { return &c.jwtJWKSRefresh })},
	{"jwt-audience", "", "required audience (aud) of tokens; empty: not checked", stringSetter(func(c *serveConfig) *string { return &c.jwtAudience })},
	{"jwt-issuer", "", "required issuer (iss) of tokens; empty: not checked", stringSetter(func(c *serveConfig) *string { return &c.jwtIssuer })},
	{"jwt-cookie", auth.DefaultCookie, "cookie that may carry the token (browsers cannot set WebSocket headers); - disables it", nameSetter(func(c *serveConfig) *string { return &c.jwtCookie })},
	{"jwt-query-param", auth.DefaultQueryParam, "query parameter that may carry the token; - disables it", nameSetter(func(c *serveConfig) *string { return &c.jwtQueryParam })},
	{"allowed-origins", "", "browser origins allowed besides the gateway's own, comma-separated host patterns (chat.example.com, *.example.com, https://app.example.com); empty: same origin only", func(c *serveConfig, v string) error {
		c.allowedOrigins = nil
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			if _, err := path.Match(s, ""); err != nil {
				return fmt.Errorf("%q is not a host pattern: %v", s, err)
			}
			c.allowedOrigins = append(c.allowedOrigins, s)
		}
		return nil
	}},
	{"tls-cert", "", "PEM certificate chain: serve HTTPS and WSS (with --tls-key)", stringSetter(func(c *serveConfig) *string { return &c.tlsCert })},
	{"tls-key", "", "PEM private key of --tls-cert", stringSetter(func(c *serveConfig) *string { return &c.tlsKey })},
	{"read-limit", "1MiB", "largest inbound WebSocket message; a larger one closes the socket 1009", sizeSetter(1<<10, func(c *serveConfig) *int64 { return &c.readLimit })},
	{"header-timeout", "10s", "time a connection has for its TLS handshake and request headers", durationSetter(func(c *serveConfig) *time.Duration { return &c.headerTimeout })},
	{"handshake-timeout", "30s", "time a connection has to send a whole HTTP request, such as a WebSocket handshake", durationSetter(func(c *serveConfig) *time.Duration { return &c.handshakeTimeout })},
	{"max-run-events", "100000", "events the agent may store in one run; then the turn ends with RUN_ERROR limit_exceeded", positiveInt(func(c *serveConfig) *int { return &c.maxRunEvents })},
	{"max-run-bytes", "64MiB", "bytes of events the agent may store in one run (RUN_ERROR limit_exceeded)", sizeSetter(1<<10, func(c *serveConfig) *int64 { return &c.maxRunBytes })},
	{"max-event-bytes", "1MiB", "largest event the agent may emit (RUN_ERROR limit_exceeded)", sizeSetter(1<<10, func(c *serveConfig) *int64 { return &c.maxEventBytes })},
	{"max-run-backlog", "8MiB", "bytes of one run's events waiting to be stored (JetStream slow or away); beyond, the agent waits", sizeSetter(64<<10, func(c *serveConfig) *int64 { return &c.maxRunBacklog })},
	{"max-backlog", "256MiB", "bytes of every run's events waiting to be stored; beyond, each agent with events waiting waits", sizeSetter(1<<20, func(c *serveConfig) *int64 { return &c.maxBacklog })},
	{"socket-queue-frames", strconv.Itoa(conversation.DefaultQueueSize), "outbound frames queued per socket; a client too slow for them is closed 1013 and resumes from the log", positiveInt(func(c *serveConfig) *int { return &c.queueFrames })},
	{"socket-queue-bytes", "4MiB", "outbound bytes queued per socket (closed 1013 beyond, as for --socket-queue-frames)", sizeSetter(64<<10, func(c *serveConfig) *int64 { return &c.queueBytes })},
	{"early-aborts", strconv.Itoa(conversation.DefaultEarlyAborts), "aborts remembered per socket for run frames not yet arrived (the oldest is forgotten beyond)", positiveInt(func(c *serveConfig) *int { return &c.earlyAborts })},
	{"early-abort-ttl", conversation.DefaultEarlyAbortTTL.String(), "how long such an abort is remembered", durationSetter(func(c *serveConfig) *time.Duration { return &c.earlyAbortTTL })},
	{"max-socket-turns", strconv.Itoa(conversation.DefaultMaxTurnsPerSocket), "turns running at once on one conversation socket; a run frame for another runId gets RUN_ERROR limit_exceeded", positiveInt(func(c *serveConfig) *int { return &c.maxSocketTurns })},
	{"max-follows", strconv.Itoa(conversation.DefaultMaxFollowsPerSocket), "threads one conversation socket may follow at once; a follow frame for another thread gets RUN_ERROR limit_exceeded", positiveInt(func(c *serveConfig) *int { return &c.maxFollows })},
	{"max-principal-sockets", strconv.Itoa(conversation.DefaultMaxSocketsPerPrincipal), "sockets and HTTP streams one principal may hold at once; beyond, 429 before the upgrade", positiveInt(func(c *serveConfig) *int { return &c.maxPrincipalSock })},
	{"run-frame-rate", strconv.Itoa(conversation.DefaultRunFrameRate), "run frames per second a conversation socket may send on average (aborts not counted); beyond, RUN_ERROR limit_exceeded", rateSetter(func(c *serveConfig) *float64 { return &c.runFrameRate })},
	{"run-frame-burst", strconv.Itoa(conversation.DefaultRunFrameBurst), "run frames a conversation socket may send at once before --run-frame-rate applies", positiveInt(func(c *serveConfig) *int { return &c.runFrameBurst })},
	{"max-principal-turns", strconv.Itoa(conversation.DefaultMaxTurnsPerPrincipal), "turns one principal runs at once on this gateway, by every door (sockets, HTTP POSTs, /agui, POST /api/threads/{id}/runs); beyond, RUN_ERROR limit_exceeded or 429", positiveInt(func(c *serveConfig) *int { return &c.maxPrincipalTurns })},
	{"principal-turn-rate", strconv.Itoa(conversation.DefaultTurnStartRate), "turn starts per second one principal may make on average, by every door; beyond, RUN_ERROR limit_exceeded or 429", rateSetter(func(c *serveConfig) *float64 { return &c.principalTurnRate })},
	{"principal-turn-burst", strconv.Itoa(conversation.DefaultTurnStartBurst), "turn starts one principal may make at once before --principal-turn-rate applies", positiveInt(func(c *serveConfig) *int { return &c.principalTurnBurst })},
	{"max-principal-hydrates", strconv.Itoa(conversation.DefaultMaxHydratesPerPrincipal), "hydrates (GET ?threadId=) one principal may have in progress at once; beyond, 429", positiveInt(func(c *serveConfig) *int { return &c.maxPrincipalHydrates })},
	{"max-principal-readers", strconv.Itoa(durable.DefaultMaxReaders), "Durable Streams reads (GET) one principal may have in progress at once; beyond, 429", positiveInt(func(c *serveConfig) *int { return &c.maxPrincipalReaders })},
	{"refusal-delay", conversation.DefaultRefusalDelay.String(), "how long a refusal by one of the per-socket or per-principal bounds above waits: a 429 is answered after it, a socket whose frame was refused reads its next frame after it; a client over its bounds that goes on asking is slowed to one refusal per delay per connection; 0: none", offDurationSetter(func(c *serveConfig) *time.Duration { return &c.refusalDelay })},
	{"principal-limit", "", "other per-principal bounds for one principal (a scheduler's subject), SUBJECT:key=value,... with keys sockets, turns, turn-rate, turn-burst, hydrates, readers; repeat the flag for more (in the environment variable: one per line)", principalLimitSetter},
	{"token-budget", "0", "tokens (the usage's totalTokens) one principal may use per --token-budget-period, cluster-wide; a run started beyond ends RUN_ERROR budget_exceeded before its agent is called; a token's " + auth.BudgetClaim + " claim overrides it for its principal; 0: no budget", func(c *serveConfig, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errors.New("want a number of tokens, 0 for none")
		}
		c.tokenBudget = n
		return nil
	}},
	{"token-budget-period", "24h", "period of --token-budget and of the usage ledger's aggregates (GET /api/usage reports whole periods), a whole number of seconds; periods start at its multiples since the Unix epoch (UTC midnight for 24h)", durationSetter(func(c *serveConfig) *time.Duration { return &c.tokenBudgetPeriod })},
	{"usage-retention", "2160h", "how long the usage ledger keeps a period's usage and a run's record after their last update (at least --token-budget-period)", durationSetter(func(c *serveConfig) *time.Duration { return &c.usageRetention })},
	{"agent-idle-timeout", "5m", "time the agent may emit nothing before its turn is ended (RUN_ERROR limit_exceeded)", durationSetter(func(c *serveConfig) *time.Duration { return &c.agentIdleTimeout })},
	{"chat-path", "/api/chat", "path of the HTTP transport with server-sent events (POST starts or resumes a turn, GET replays a run); empty turns it off", pathSetter(func(c *serveConfig) *string { return &c.chatPath })},
	{"chat-ndjson-path", "/api/chat/ndjson", "path of the HTTP transport with NDJSON lines (as --chat-path); empty turns it off", pathSetter(func(c *serveConfig) *string { return &c.ndjsonPath })},
	{"durable-path", "/v1/stream", "prefix of the Durable Streams protocol (a stream's name is the rest of the path); empty turns it off", pathSetter(func(c *serveConfig) *string { return &c.durablePath })},
	{"durable-alt-path", "/streams", "second Durable Streams prefix taking the name as one URL-encoded segment (the TanStack adapter's shape); empty turns it off", pathSetter(func(c *serveConfig) *string { return &c.durableAltPath })},
	{"durable-long-poll", "20s", "how long a Durable Streams long-poll waits for data (then 204), and the interval of SSE keep-alives", durationSetter(func(c *serveConfig) *time.Duration { return &c.durableLongPoll })},
	{"durable-max-body", "1MiB", "largest Durable Streams PUT or POST body (413 beyond; at most the NATS max payload less 4 KiB)", sizeSetter(1<<10, func(c *serveConfig) *int64 { return &c.durableMaxBody })},
	{"agui-path", "/agui", "path of AG-UI's own HTTP transport (@ag-ui/client HttpAgent: server-sent events without the run.accepted marker; as --chat-path otherwise); empty turns it off", pathSetter(func(c *serveConfig) *string { return &c.aguiPath })},
	{"log-format", "auto", "auto (text on a terminal, else json), text (colour on a terminal) or json", func(c *serveConfig, v string) error {
		switch v {
		case "auto", "text", "json":
		default:
			return fmt.Errorf("want auto, text or json")
		}
		c.logFormat = v
		return nil
	}},
	{"log-level", "info", "debug, info, warn or error", func(c *serveConfig, v string) error {
		if _, err := parseLevel(v); err != nil {
			return err
		}
		c.logLevel = v
		return nil
	}},
	{"debug-addr", "", "listen address of Go's pprof (/debug/pprof/) and the runtime metrics (/debug/metrics), apart from --addr; a port or :port is on loopback (127.0.0.1); empty: off. It serves heap profiles, goroutine stacks and CPU profiles without authentication: never on an address the clients reach", debugAddrSetter},
}

// rateSetter parses a positive rate per second into the field field returns.
func rateSetter(field func(*serveConfig) *float64) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		r, err := parseRate(v)
		if err != nil {
			return err
		}
		*field(c) = r
		return nil
	}
}

func parseRate(v string) (float64, error) {
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || !(r > 0) || r > 1e9 {
		return 0, fmt.Errorf("want a positive number")
	}
	return r, nil
}

// principalLimit is one principal's bounds of --principal-limit; a zero field keeps the flag's.
type principalLimit struct {
	sockets, turns, turnBurst, hydrates, readers int
	turnRate                                     float64
}

// principalLimitSetter adds the "SUBJECT:key=value,..." entries of v (one per line) to
// --principal-limit. The subject is what comes before the last colon (a subject may hold
// colons, a key never does).
func principalLimitSetter(c *serveConfig, v string) error {
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ':')
		if i <= 0 {
			return fmt.Errorf("want SUBJECT:key=value,..., e.g. scheduler:turns=500,turn-rate=50")
		}
		sub, l := line[:i], principalLimit{}
		for _, kv := range strings.Split(line[i+1:], ",") {
			k, val, _ := strings.Cut(strings.TrimSpace(kv), "=")
			if k == "turn-rate" {
				r, err := parseRate(val)
				if err != nil {
					return fmt.Errorf("%s: turn-rate: %v", sub, err)
				}
				l.turnRate = r
				continue
			}
			field := map[string]*int{"sockets": &l.sockets, "turns": &l.turns, "turn-burst": &l.turnBurst, "hydrates": &l.hydrates, "readers": &l.readers}[k]
			n, err := strconv.Atoi(val)
			if field == nil {
				return fmt.Errorf("%s: unknown key %q; want sockets, turns, turn-rate, turn-burst, hydrates or readers", sub, k)
			}
			if err != nil || n < 1 {
				return fmt.Errorf("%s: %s: want a positive integer", sub, k)
			}
			*field = n
		}
		if c.principalLimits == nil {
			c.principalLimits = map[string]principalLimit{}
		}
		c.principalLimits[sub] = l
	}
	return nil
}

// stringSetter stores the value as it is into the field field returns.
func stringSetter(field func(*serveConfig) *string) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		*field(c) = v
		return nil
	}
}

// nameSetter stores a cookie or query parameter name: printable ASCII without separators, or
// "-".
func nameSetter(field func(*serveConfig) *string) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		if v == "" {
			return errors.New(`must not be empty (use - to disable)`)
		}
		for i := 0; i < len(v); i++ {
			if b := v[i]; b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}&#%+`, b) >= 0 {
				return fmt.Errorf("%q is not a valid name", v)
			}
		}
		*field(c) = v
		return nil
	}
}

// positiveInt parses a positive integer into the field field returns.
func positiveInt(field func(*serveConfig) *int) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("want a positive integer")
		}
		*field(c) = n
		return nil
	}
}

// intRange parses an integer from 1 to max.
func intRange(max int, field func(*serveConfig) *int) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > max {
			return fmt.Errorf("want an integer from 1 to %d", max)
		}
		*field(c) = n
		return nil
	}
}

// sizeSetter parses a size in bytes, at least min: 4096, 512KiB, 1MiB, 2GiB.
func sizeSetter(min int64, field func(*serveConfig) *int64) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		num, unit := v, int64(1)
		for _, u := range []struct {
			suffix string
			n      int64
		}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
			if strings.HasSuffix(v, u.suffix) {
				num, unit = strings.TrimSuffix(v, u.suffix), u.n
				break
			}
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 || n > (1<<40)/unit {
			return fmt.Errorf("want a size such as 65536, 512KiB or 1MiB")
		}
		if n*unit < min {
			return fmt.Errorf("must be at least %d bytes", min)
		}
		*field(c) = n * unit
		return nil
	}
}

// memorySetter parses auto, off (when off is allowed) or a size of at least 16 MiB.
func memorySetter(off bool, field func(*serveConfig) *int64) func(*serveConfig, string) error {
	size := sizeSetter(16<<20, field)
	return func(c *serveConfig, v string) error {
		switch {
		case v == "auto":
			*field(c) = memoryAuto
			return nil
		case v == "off" && off:
			*field(c) = memoryOff
			return nil
		}
		if err := size(c, v); err != nil {
			if off {
				return fmt.Errorf("want auto, off or a size of at least 16MiB, such as 2GiB")
			}
			return fmt.Errorf("want auto or a size of at least 16MiB, such as 512MiB")
		}
		return nil
	}
}

// reservedPaths are the gateway's own endpoints, which an HTTP transport path must not take.
var reservedPaths = map[string]bool{"/": true, "/ws": true, "/metrics": true, "/healthz": true, "/readyz": true}

// pathSetter stores an HTTP path ("" turns the endpoint off): it must start with / and hold
// no whitespace, query, fragment or pattern wildcard.
func pathSetter(field func(*serveConfig) *string) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		if v != "" {
			if !strings.HasPrefix(v, "/") || strings.ContainsAny(v, " \t\r\n?#{}") {
				return fmt.Errorf("want a path such as /api/chat, or empty to turn it off")
			}
			if reservedPaths[v] {
				return fmt.Errorf("%s is an endpoint of the gateway already", v)
			}
		}
		*field(c) = v
		return nil
	}
}

// durationSetter parses a positive Go duration (90s, 5m, 1h30m) into the field field returns.
func durationSetter(field func(*serveConfig) *time.Duration) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s, 5m or 1h")
		}
		if d <= 0 {
			return fmt.Errorf("must be positive")
		}
		*field(c) = d
		return nil
	}
}

// offDurationSetter is durationSetter where 0 is accepted too: none, the field's -1.
func offDurationSetter(field func(*serveConfig) *time.Duration) func(*serveConfig, string) error {
	positive := durationSetter(field)
	return func(c *serveConfig, v string) error {
		d, err := time.ParseDuration(v)
		switch {
		case err == nil && d == 0:
			*field(c) = -1
			return nil
		case err == nil && d < 0:
			return fmt.Errorf("must not be negative (0: none)")
		}
		return positive(c, v)
	}
}

// flagValue adapts a serveFlag to flag.Value, so the standard parser handles --x=v and --x v.
type flagValue struct {
	cfg  *serveConfig
	f    serveFlag
	text string
}

func (v *flagValue) String() string { return v.text }

func (v *flagValue) Set(s string) error {
	if err := v.f.set(v.cfg, s); err != nil {
		return err
	}
	v.text = s
	return nil
}

// parseServe parses the command line of `wsgateway serve`. Precedence: a flag, then its
// environment variable, then the default. It returns flag.ErrHelp after printing the help to
// stdout for -h/--help, and an error wrapping errUsage for anything invalid.
func parseServe(args []string, getenv func(string) (string, bool), stdout io.Writer) (serveConfig, error) {
	var cfg serveConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	values := make(map[string]*flagValue, len(serveFlags))
	for _, f := range serveFlags {
		v := &flagValue{cfg: &cfg, f: f}
		values[f.name] = v
		fs.Var(v, f.name, f.usage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printServeHelp(stdout)
			return cfg, flag.ErrHelp
		}
		return cfg, fmt.Errorf("%w: %v (see 'wsgateway serve --help')", errUsage, err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q (see 'wsgateway serve --help')", errUsage, fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, f := range serveFlags {
		if given[f.name] {
			continue
		}
		value, source := f.def, "default"
		if s, ok := getenv(f.env()); ok {
			value, source = s, f.env()
		}
		if err := values[f.name].Set(value); err != nil {
			return cfg, fmt.Errorf("%w: %s=%q: %v", errUsage, source, value, err)
		}
	}
	if len(cfg.natsURLs) == 0 && cfg.replicas > 1 {
		return cfg, fmt.Errorf("%w: --replicas %d needs a NATS cluster (--nats-url); the embedded server has one replica", errUsage, cfg.replicas)
	}
	if len(cfg.natsURLs) == 0 && (cfg.natsCreds != "" || cfg.natsTLSCA != "" || cfg.natsTLSCert != "" || cfg.natsTLSKey != "") {
		return cfg, fmt.Errorf("%w: --nats-creds and --nats-tls-* apply to external NATS servers; set --nats-url too", errUsage)
	}
	if (cfg.natsTLSCert == "") != (cfg.natsTLSKey == "") {
		return cfg, fmt.Errorf("%w: --nats-tls-cert and --nats-tls-key go together", errUsage)
	}
	if err := checkSecurity(&cfg); err != nil {
		return cfg, err
	}
	if cfg.chatPath != "" && cfg.chatPath == cfg.ndjsonPath {
		return cfg, fmt.Errorf("%w: --chat-path and --chat-ndjson-path must differ", errUsage)
	}
	if cfg.aguiPath != "" && (cfg.aguiPath == cfg.chatPath || cfg.aguiPath == cfg.ndjsonPath) {
		return cfg, fmt.Errorf("%w: --agui-path must differ from --chat-path and --chat-ndjson-path", errUsage)
	}
	if err := checkAgent(&cfg, getenv); err != nil {
		return cfg, err
	}
	if cfg.tokenBudgetPeriod%time.Second != 0 {
		return cfg, fmt.Errorf("%w: --token-budget-period %v is not a whole number of seconds", errUsage, cfg.tokenBudgetPeriod)
	}
	if cfg.usageRetention < cfg.tokenBudgetPeriod {
		return cfg, fmt.Errorf("%w: --usage-retention %v is shorter than --token-budget-period %v", errUsage, cfg.usageRetention, cfg.tokenBudgetPeriod)
	}
	return cfg, nil
}

// checkAgent checks the flags of the agent together and reads the openai agent's API key.
func checkAgent(cfg *serveConfig, getenv func(string) (string, bool)) error {
	switch {
	case cfg.agent == agentDemo && (cfg.agentURL != "" || len(cfg.agentHeader) > 0 || len(cfg.agentForward) > 0):
		return fmt.Errorf("%w: --agent-url, --agent-header and --agent-forward-headers are used only with --agent agui or openai", errUsage)
	case cfg.agent != agentDemo && cfg.agentURL == "":
		return fmt.Errorf("%w: --agent %s needs --agent-url (%s)", errUsage, cfg.agent, map[string]string{
			agentAGUI:   "the AG-UI endpoint the turns are POSTed to, e.g. http://127.0.0.1:8000/agent",
			agentOpenAI: "the API base, e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1",
		}[cfg.agent])
	case cfg.takeover == "on" && cfg.agent == agentOpenAI:
		return fmt.Errorf("%w: --takeover on needs an agent that replays a run (demo, or an agui upstream that does); a Chat Completions server does not: use --takeover continue", errUsage)
	case cfg.takeover == "continue" && cfg.agent == agentDemo:
		return fmt.Errorf("%w: --takeover continue is for agents that do not replay; the demo agent does: use --takeover on (or auto)", errUsage)
	case cfg.agent == agentOpenAI && strings.TrimSpace(cfg.agentModel) == "":
		return fmt.Errorf("%w: --agent openai needs --agent-model (e.g. gpt-4o-mini)", errUsage)
	case cfg.agent != agentOpenAI && cfg.agentModel != "":
		return fmt.Errorf("%w: --agent-model is used only with --agent openai", errUsage)
	}
	if cfg.agent == agentOpenAI {
		cfg.agentAPIKey, _ = getenv(cfg.agentAPIKeyEnv)
	}
	return nil
}

// headerSetter appends the "Name: value" headers of v (one per line) to --agent-header; an
// empty v sets none.
func headerSetter(c *serveConfig, v string) error {
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || !isToken(name) {
			return fmt.Errorf("want \"Name: value\", e.g. \"X-Api-Key: secret\"")
		}
		if c.agentHeader == nil {
			c.agentHeader = http.Header{}
		}
		c.agentHeader.Add(name, value)
	}
	return nil
}

// unforwardable are headers of the handshake that mean nothing upstream, or that the agent
// sets itself.
var unforwardable = map[string]bool{
	"Host": true, "Connection": true, "Upgrade": true, "Content-Length": true, "Content-Type": true,
	"Accept": true, "Transfer-Encoding": true, "Te": true, "Trailer": true, "Keep-Alive": true,
}

// forwardSetter stores the comma-separated header names of --agent-forward-headers.
func forwardSetter(c *serveConfig, v string) error {
	c.agentForward = nil
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !isToken(name):
			return fmt.Errorf("%q is not a header name", name)
		case unforwardable[canon] || strings.HasPrefix(canon, "Sec-Websocket-"):
			return fmt.Errorf("%s is a header of the handshake itself, not one to forward", canon)
		}
		c.agentForward = append(c.agentForward, canon)
	}
	return nil
}

// isToken reports whether s is an HTTP token (a header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) >= 0 {
			return false
		}
	}
	return true
}

// checkSecurity checks the flags of authentication and TLS together.
func checkSecurity(cfg *serveConfig) error {
	keys := 0
	for _, k := range []string{cfg.jwtSecretEnv, cfg.jwtKeyFile, cfg.jwtJWKSFile, cfg.jwtJWKSURL} {
		if k != "" {
			keys++
		}
	}
	switch {
	case cfg.auth == authJWT && keys != 1:
		return fmt.Errorf("%w: --auth jwt needs exactly one of --jwt-secret-env, --jwt-key-file, --jwt-jwks-file and --jwt-jwks-url", errUsage)
	case cfg.jwtJWKSCA != "" && cfg.jwtJWKSURL == "":
		return fmt.Errorf("%w: --jwt-jwks-ca applies to --jwt-jwks-url", errUsage)
	case cfg.auth == authNone && (keys > 0 || cfg.jwtAudience != "" || cfg.jwtIssuer != ""):
		return fmt.Errorf("%w: --jwt-* flags need --auth jwt", errUsage)
	case (cfg.tlsCert == "") != (cfg.tlsKey == ""):
		return fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	case cfg.maxEventBytes > cfg.maxRunBytes:
		return fmt.Errorf("%w: --max-event-bytes %d is larger than --max-run-bytes %d", errUsage, cfg.maxEventBytes, cfg.maxRunBytes)
	}
	return nil
}

const serveHelpHead = `wsgateway serve: run the WebSocket gateway.

A browser (or any client) keeps one WebSocket per conversation at /ws and sends AG-UI
RunAgentInput frames; the agent's events for each turn are written to a NATS JetStream log
before they are delivered. A client that lost its socket reopens
/ws?runId=<runId>&offset=<last id> on any gateway process and receives exactly the rest.

With no --nats-url, the gateway runs an embedded NATS server storing under --data-dir, so one
command runs everything. Its client URL is logged at start (nats_url); a second gateway started
with --nats-url <that URL> serves the same runs.

By default (--auth none) there is no authentication, for development on a trusted network.
In production use --auth jwt (a token from an "Authorization: Bearer" header, the --jwt-cookie
cookie or the --jwt-query-param parameter; its subject owns the runs it starts), --tls-cert and
--tls-key (or a TLS-terminating proxy), and --allowed-origins for pages served elsewhere.

Usage:
  wsgateway [serve] [flags]

Endpoints:
  /ws        conversation socket (no offset) or resume socket (?runId=&offset=)
  /api/chat  HTTP transport, server-sent events (--chat-path); /api/chat/ndjson: NDJSON
  /agui      AG-UI's HTTP transport, for @ag-ui/client's HttpAgent (--agui-path)
  /          chat page
  /metrics   Prometheus metrics
  /healthz   liveness
  /readyz    readiness (NATS connected, stream and buckets ready)
  with --debug-addr, on that listener only: /debug/pprof/ (Go's pprof), /debug/metrics

Flags (each can also be set by its environment variable; a flag wins over the variable):
`

const serveHelpTail = `
Durations are Go durations: 500ms, 30s, 5m, 1h30m.

Examples:
  wsgateway                                   embedded NATS in ./data, http://127.0.0.1:8080
  wsgateway --addr :8080 --data-dir /var/lib/wsgateway
  wsgateway --nats-url nats://n1:4222,nats://n2:4222,nats://n3:4222 --replicas 3
  WSGATEWAY_LOG_FORMAT=json WSGATEWAY_LOG_LEVEL=debug wsgateway
  wsgateway --agent agui --agent-url http://127.0.0.1:8000/agent
  wsgateway --agent openai --agent-url http://127.0.0.1:11434/v1 --agent-model llama3.2
  JWT_SECRET=... wsgateway --auth jwt --jwt-secret-env JWT_SECRET --jwt-audience wsgateway \
      --tls-cert cert.pem --tls-key key.pem --addr :443

Signals: SIGTERM or SIGINT stops accepting, closes sockets with 1012 (clients resume elsewhere),
lets running turns finish for --drain-timeout, then aborts the rest; a second signal exits at once.
`

func printServeHelp(w io.Writer) {
	io.WriteString(w, serveHelpHead)
	for _, f := range serveFlags {
		def := f.def
		if def == "" {
			def = "empty"
		}
		fmt.Fprintf(w, "  --%s (default %s; env %s)\n      %s\n", f.name, def, f.env(), f.usage)
	}
	io.WriteString(w, serveHelpTail)
}
