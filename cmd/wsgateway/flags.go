package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
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
const maxReplicas = 5

// serveConfig is the validated command line of `wsgateway serve`.
type serveConfig struct {
	addr         string
	dataDir      string
	natsURLs     []string // empty: embedded server
	natsCreds    string
	natsTLSCA    string
	natsTLSCert  string
	natsTLSKey   string
	replicas     int
	agent        string
	agentURL     string
	heartbeat    time.Duration
	idleTimeout  time.Duration
	leaseTTL     time.Duration
	retention    time.Duration
	drainTimeout time.Duration
	logFormat    string
	logLevel     string
}

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
	{"addr", "127.0.0.1:8080", "HTTP listen address (host:port; port 0 picks a free port)", func(c *serveConfig, v string) error {
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
	{"replicas", "1", "replicas of the run-log stream and its buckets (1 to 5; more than 1 needs a NATS cluster)", func(c *serveConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxReplicas {
			return fmt.Errorf("want an integer from 1 to %d", maxReplicas)
		}
		c.replicas = n
		return nil
	}},
	{"agent", agentDemo, "the agent that answers: demo (built in), agui or openai (not available yet)", func(c *serveConfig, v string) error {
		switch v {
		case agentDemo:
		case agentAGUI, agentOpenAI:
			return fmt.Errorf("agent %q is not available yet in this version; use %q", v, agentDemo)
		default:
			return fmt.Errorf("unknown agent %q; want %s, %s or %s", v, agentDemo, agentAGUI, agentOpenAI)
		}
		c.agent = v
		return nil
	}},
	{"agent-url", "", "upstream URL of the agui or openai agent", func(c *serveConfig, v string) error {
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
	{"heartbeat", "30s", "interval of the {\"type\":\"ping\"} frames and WebSocket pings", durationSetter(func(c *serveConfig) *time.Duration { return &c.heartbeat })},
	{"idle-timeout", "5m", "close a socket with no inbound frame for this long, unless a turn it started is still producing", durationSetter(func(c *serveConfig) *time.Duration { return &c.idleTimeout })},
	{"lease-ttl", "15s", "producer lease; a run whose gateway died is ended (RUN_ERROR producer_lost) after about this long", durationSetter(func(c *serveConfig) *time.Duration { return &c.leaseTTL })},
	{"retention", "24h", "how long run logs are kept (resumable)", durationSetter(func(c *serveConfig) *time.Duration { return &c.retention })},
	{"drain-timeout", "10s", "on SIGTERM/SIGINT, how long running turns may finish before they are aborted", durationSetter(func(c *serveConfig) *time.Duration { return &c.drainTimeout })},
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
}

// stringSetter stores the value as it is into the field field returns.
func stringSetter(field func(*serveConfig) *string) func(*serveConfig, string) error {
	return func(c *serveConfig, v string) error {
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
	if cfg.agentURL != "" && cfg.agent == agentDemo {
		return cfg, fmt.Errorf("%w: --agent-url is used only with --agent agui or openai", errUsage)
	}
	return cfg, nil
}

const serveHelpHead = `wsgateway serve: run the WebSocket gateway.

A browser (or any client) keeps one WebSocket per conversation at /ws and sends AG-UI
RunAgentInput frames; the agent's events for each turn are written to a NATS JetStream log
before they are delivered. A client that lost its socket reopens
/ws?runId=<runId>&offset=<last id> on any gateway process and receives exactly the rest.

With no --nats-url, the gateway runs an embedded NATS server storing under --data-dir, so one
command runs everything. Its client URL is logged at start (nats_url); a second gateway started
with --nats-url <that URL> serves the same runs.

Authentication is not implemented yet (development mode): run it on a trusted network.

Usage:
  wsgateway [serve] [flags]

Endpoints:
  /ws        conversation socket (no offset) or resume socket (?runId=&offset=)
  /          chat page
  /metrics   Prometheus metrics
  /healthz   liveness
  /readyz    readiness (NATS connected, stream and buckets ready)

Flags (each can also be set by its environment variable; a flag wins over the variable):
`

const serveHelpTail = `
Durations are Go durations: 500ms, 30s, 5m, 1h30m.

Examples:
  wsgateway                                   embedded NATS in ./data, http://127.0.0.1:8080
  wsgateway --addr :8080 --data-dir /var/lib/wsgateway
  wsgateway --nats-url nats://n1:4222,nats://n2:4222,nats://n3:4222 --replicas 3
  WSGATEWAY_LOG_FORMAT=json WSGATEWAY_LOG_LEVEL=debug wsgateway

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
