package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/conversation"
)

// The idle sockets' poller lives as long as the process (conversation/poller_linux.go).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/wsgateway/wsgateway/conversation.(*poller).run"))
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestParseServeDefaults(t *testing.T) {
	got, err := parseServe(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("parseServe(nil) error: %v", err)
	}
	want := serveConfig{
		addr:            "127.0.0.1:8080",
		dataDir:         "./data",
		replicas:        1,
		streams:         1,
		agent:           "demo",
		heartbeat:       30 * time.Second,
		idleTimeout:     5 * time.Minute,
		leaseTTL:        15 * time.Second,
		takeover:        "auto",
		maxTakeovers:    3,
		retention:       24 * time.Hour,
		threadRetention: 30 * 24 * time.Hour,
		maxThreads:      10000,
		drainTimeout:    10 * time.Second,
		chatPath:        "/api/chat",
		ndjsonPath:      "/api/chat/ndjson",
		aguiPath:        "/agui",
		logFormat:       "auto",
		logLevel:        "info",
	}
	want.auth, want.jwtCookie, want.jwtQueryParam = "none", "wsgateway_token", "access_token"
	want.jwtJWKSRefresh = 15 * time.Minute
	want.durablePath, want.durableAltPath, want.durableLongPoll, want.durableMaxBody = "/v1/stream", "/streams", 20*time.Second, 1<<20
	want.readLimit, want.headerTimeout, want.handshakeTimeout = 1<<20, 10*time.Second, 30*time.Second
	want.maxRunEvents, want.maxRunBytes, want.maxEventBytes = 100000, 64<<20, 1<<20
	want.agentIdleTimeout = 5 * time.Minute
	want.maxRunBacklog, want.maxBacklog, want.shutdownTimeout = 8<<20, 256<<20, 15*time.Second
	want.queueFrames, want.queueBytes, want.earlyAborts, want.earlyAbortTTL = 16384, 4<<20, 64, 30*time.Second
	want.maxSocketTurns, want.maxPrincipalSock, want.runFrameRate, want.runFrameBurst, want.maxFollows = 16, 64, 10, 20, 16
	want.agentConnectTimeout, want.agentFirstEvent, want.agentGapTimeout = 10*time.Second, time.Minute, time.Minute
	want.agentTurnTimeout, want.agentAPIKeyEnv = 30*time.Minute, "OPENAI_API_KEY"
	want.agentHistoryBytes = 512 << 10
	want.multitask = "enqueue"
	want.idleReturn = true
	want.maxPrincipalTurns, want.principalTurnRate, want.principalTurnBurst = 32, 10, 40
	want.maxPrincipalHydrates, want.maxPrincipalReaders, want.refusalDelay = 8, 16, 500*time.Millisecond
	want.tokenBudgetPeriod, want.usageRetention = 24*time.Hour, 90*24*time.Hour
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseServe(nil) =\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseServe(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(serveConfig) bool
	}{
		{"flag", []string{"--idle-timeout", "90s"}, nil,
			func(c serveConfig) bool { return c.idleTimeout == 90*time.Second }},
		{"flag with =", []string{"--addr=:9000"}, nil,
			func(c serveConfig) bool { return c.addr == ":9000" }},
		{"principal limits, a subject with colons", []string{"--principal-limit", "https://id.example.com/u/1:turns=500,turn-rate=50", "--principal-limit", "svc:readers=40"}, nil,
			func(c serveConfig) bool {
				return c.principalLimits["https://id.example.com/u/1"] == principalLimit{turns: 500, turnRate: 50} &&
					c.principalLimits["svc"] == principalLimit{readers: 40}
			}},
		{"env", nil, map[string]string{"WSGATEWAY_IDLE_TIMEOUT": "2m"},
			func(c serveConfig) bool { return c.idleTimeout == 2*time.Minute }},
		{"flag wins over env", []string{"--heartbeat", "5s"}, map[string]string{"WSGATEWAY_HEARTBEAT": "7s"},
			func(c serveConfig) bool { return c.heartbeat == 5*time.Second }},
		{"nats urls", nil, map[string]string{"WSGATEWAY_NATS_URL": "nats://a:4222, tls://b:4222"},
			func(c serveConfig) bool {
				return reflect.DeepEqual(c.natsURLs, []string{"nats://a:4222", "tls://b:4222"})
			}},
		{"chat paths", []string{"--chat-path", "/v1/chat"}, map[string]string{"WSGATEWAY_CHAT_NDJSON_PATH": ""},
			func(c serveConfig) bool { return c.chatPath == "/v1/chat" && c.ndjsonPath == "" }},
		{"agui path", []string{"--agui-path", "/v1/agui"}, nil, func(c serveConfig) bool { return c.aguiPath == "/v1/agui" }},
		{"agent history", []string{"--agent-history", "client", "--agent-history-bytes", "0"}, nil,
			func(c serveConfig) bool { return c.agentHistoryClient && c.agentHistoryBytes == 0 }},
		{"multitask", []string{"--multitask", "concurrent"}, nil, func(c serveConfig) bool { return c.multitask == "concurrent" }},
		{"agui path off", nil, map[string]string{"WSGATEWAY_AGUI_PATH": ""}, func(c serveConfig) bool { return c.aguiPath == "" }},
		{"debug port on loopback", []string{"--debug-addr", "6060"}, nil,
			func(c serveConfig) bool { return c.debugAddr == "127.0.0.1:6060" }},
		{"debug :port on loopback", nil, map[string]string{"WSGATEWAY_DEBUG_ADDR": ":0"},
			func(c serveConfig) bool { return c.debugAddr == "127.0.0.1:0" }},
		{"debug on a named interface", []string{"--debug-addr", "0.0.0.0:6060"}, nil,
			func(c serveConfig) bool { return c.debugAddr == "0.0.0.0:6060" }},
		{"debug on IPv6 loopback", []string{"--debug-addr", "[::1]:6060"}, nil,
			func(c serveConfig) bool { return c.debugAddr == "[::1]:6060" }},
		{"replicas with a cluster", []string{"--nats-url", "nats://a:4222", "--replicas", "3"}, nil,
			func(c serveConfig) bool { return c.replicas == 3 }},
		{"every env var", nil, map[string]string{
			"WSGATEWAY_ADDR": "127.0.0.1:0", "WSGATEWAY_DATA_DIR": "/tmp/x", "WSGATEWAY_LEASE_TTL": "3s",
			"WSGATEWAY_RETENTION": "1h", "WSGATEWAY_DRAIN_TIMEOUT": "1s", "WSGATEWAY_LOG_FORMAT": "json",
			"WSGATEWAY_LOG_LEVEL": "debug", "WSGATEWAY_AGENT": "demo",
		}, func(c serveConfig) bool {
			return c.addr == "127.0.0.1:0" && c.dataDir == "/tmp/x" && c.leaseTTL == 3*time.Second &&
				c.retention == time.Hour && c.drainTimeout == time.Second && c.logFormat == "json" &&
				c.logLevel == "debug"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseServe(tt.args, env(tt.env), io.Discard)
			if err != nil {
				t.Fatalf("parseServe(%q) error: %v", tt.args, err)
			}
			if !tt.check(got) {
				t.Errorf("parseServe(%q) with env %v = %+v", tt.args, tt.env, got)
			}
		})
	}
}

func TestParseServeErrors(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string // in the error message
	}{
		{[]string{"--idle-timeout", "5 minutes"}, nil, `invalid value "5 minutes" for flag -idle-timeout: want a duration such as 30s, 5m or 1h`},
		{[]string{"--heartbeat", "0s"}, nil, "must be positive"},
		{[]string{"--token-budget", "-5"}, nil, "want a number of tokens, 0 for none"},
		{[]string{"--token-budget-period", "1500ms"}, nil, "--token-budget-period 1.5s is not a whole number of seconds"},
		{[]string{"--token-budget-period", "48h", "--usage-retention", "24h"}, nil, "--usage-retention 24h0m0s is shorter than --token-budget-period 48h0m0s"},
		{nil, map[string]string{"WSGATEWAY_LEASE_TTL": "soon"}, `WSGATEWAY_LEASE_TTL="soon": want a duration`},
		{[]string{"--agent", "gpt"}, nil, `unknown agent "gpt"; want demo, agui or openai`},
		{[]string{"--agent", "agui"}, nil, "--agent agui needs --agent-url"},
		{[]string{"--agent", "openai"}, nil, "--agent openai needs --agent-url"},
		{[]string{"--replicas", "0"}, nil, "want an integer from 1 to 5"},
		{[]string{"--replicas", "3"}, nil, "--replicas 3 needs a NATS cluster (--nats-url)"},
		{[]string{"--nats-url", "localhost"}, nil, `"localhost" is not a URL like nats://host:4222`},
		{[]string{"--nats-url", "http://a:4222"}, nil, "scheme must be nats, tls, ws or wss"},
		{[]string{"--addr", "8080"}, nil, "want host:port"},
		{[]string{"--log-format", "xml"}, nil, "want auto, text or json"},
		{[]string{"--debug-addr", "::1"}, nil, "want a port or host:port, e.g. 6060, :6060 (both loopback) or 0.0.0.0:6060"},
		{[]string{"--debug-addr", "localhost"}, nil, `port "localhost": want a number from 0 to 65535`},
		{[]string{"--debug-addr", "127.0.0.1:pprof"}, nil, `port "pprof": want a number from 0 to 65535`},
		{nil, map[string]string{"WSGATEWAY_DEBUG_ADDR": "70000"}, `WSGATEWAY_DEBUG_ADDR="70000": port "70000": want a number from 0 to 65535`},
		{[]string{"--idle-memory", "free"}, nil, "want keep or return"},
		{[]string{"--agent-history", "none"}, nil, "want thread or client"},
		{[]string{"--multitask", "sometimes"}, nil, "want one of enqueue, reject, interrupt, rollback, concurrent"},
		{[]string{"--agent-history-bytes", "-1"}, nil, "want a size such as 65536, 512KiB or 1MiB"},
		{[]string{"--log-level", "loud"}, nil, "want debug, info, warn or error"},
		{[]string{"--agent-url", "http://up:1"}, nil, "--agent-url, --agent-header and --agent-forward-headers are used only with --agent agui or openai"},
		{[]string{"--data-dir", ""}, nil, "must not be empty"},
		{[]string{"--nats-creds", "a.creds"}, nil, "set --nats-url too"},
		{[]string{"--nats-url", "nats://a:1", "--nats-tls-cert", "c.pem"}, nil, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"--chat-path", "api/chat"}, nil, "want a path such as /api/chat"},
		{[]string{"--chat-ndjson-path", "/api/{x}"}, nil, "want a path such as /api/chat"},
		{[]string{"--chat-path", "/ws"}, nil, "/ws is an endpoint of the gateway already"},
		{[]string{"--chat-path", "/a", "--chat-ndjson-path", "/a"}, nil, "--chat-path and --chat-ndjson-path must differ"},
		{[]string{"--agui-path", "/api/chat"}, nil, "--agui-path must differ from --chat-path and --chat-ndjson-path"},
		{[]string{"--agui-path", "/metrics"}, nil, "/metrics is an endpoint of the gateway already"},
		{[]string{"--port", "1"}, nil, "flag provided but not defined: -port"},
		{[]string{"extra"}, nil, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		_, err := parseServe(tt.args, env(tt.env), io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseServe(%q) with env %v error = %v, want errUsage containing %q", tt.args, tt.env, err, tt.want)
		}
	}
}

func TestServeHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		var out bytes.Buffer
		_, err := parseServe([]string{arg}, env(nil), &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("parseServe(%q) error = %v, want flag.ErrHelp", arg, err)
		}
		help := out.String()
		for _, f := range serveFlags {
			line := "--" + f.name + " (default "
			if !strings.Contains(help, line) || !strings.Contains(help, f.env()) {
				t.Errorf("help for %q lacks %q or %s:\n%s", arg, line, f.env(), help)
			}
		}
		for _, want := range []string{"Examples:", "/readyz", "By default (--auth none) there is no authentication"} {
			if !strings.Contains(help, want) {
				t.Errorf("help lacks %q", want)
			}
		}
	}
}

func TestFlagEnvNames(t *testing.T) {
	want := map[string]string{"idle-timeout": "WSGATEWAY_IDLE_TIMEOUT", "addr": "WSGATEWAY_ADDR", "nats-url": "WSGATEWAY_NATS_URL"}
	for _, f := range serveFlags {
		if w, ok := want[f.name]; ok && f.env() != w {
			t.Errorf("env of --%s = %s, want %s", f.name, f.env(), w)
		}
	}
}

func TestParseServeSecurity(t *testing.T) {
	tests := []struct {
		args  []string
		env   map[string]string
		check func(serveConfig) bool
	}{
		{[]string{"--auth", "jwt", "--jwt-secret-env", "S", "--jwt-audience", "a", "--jwt-issuer", "i"}, nil,
			func(c serveConfig) bool {
				return c.auth == "jwt" && c.jwtSecretEnv == "S" && c.jwtAudience == "a" && c.jwtIssuer == "i"
			}},
		{nil, map[string]string{"WSGATEWAY_AUTH": "jwt", "WSGATEWAY_JWT_JWKS_FILE": "k.json", "WSGATEWAY_JWT_COOKIE": "-"},
			func(c serveConfig) bool { return c.jwtJWKSFile == "k.json" && c.jwtCookie == "-" }},
		{[]string{"--allowed-origins", "chat.example.com, *.example.com,https://app.example.com"}, nil,
			func(c serveConfig) bool {
				return reflect.DeepEqual(c.allowedOrigins, []string{"chat.example.com", "*.example.com", "https://app.example.com"})
			}},
		{[]string{"--read-limit", "64KiB", "--max-run-bytes", "1GiB", "--max-event-bytes", "2048", "--max-run-events", "7"}, nil,
			func(c serveConfig) bool {
				return c.readLimit == 64<<10 && c.maxRunBytes == 1<<30 && c.maxEventBytes == 2048 && c.maxRunEvents == 7
			}},
		{[]string{"--max-socket-turns", "3", "--max-principal-sockets", "5", "--run-frame-rate", "0.5", "--run-frame-burst", "4", "--max-follows", "2"}, nil,
			func(c serveConfig) bool {
				return c.maxSocketTurns == 3 && c.maxPrincipalSock == 5 && c.runFrameRate == 0.5 && c.runFrameBurst == 4 && c.maxFollows == 2
			}},
		{nil, map[string]string{"WSGATEWAY_MAX_SOCKET_TURNS": "2", "WSGATEWAY_MAX_PRINCIPAL_SOCKETS": "9", "WSGATEWAY_RUN_FRAME_RATE": "3", "WSGATEWAY_RUN_FRAME_BURST": "6"},
			func(c serveConfig) bool {
				return c.maxSocketTurns == 2 && c.maxPrincipalSock == 9 && c.runFrameRate == 3 && c.runFrameBurst == 6
			}},
		{nil, nil, func(c serveConfig) bool {
			return c.maxSocketTurns == conversation.DefaultMaxTurnsPerSocket && c.maxPrincipalSock == conversation.DefaultMaxSocketsPerPrincipal &&
				c.maxFollows == conversation.DefaultMaxFollowsPerSocket &&
				c.runFrameRate == conversation.DefaultRunFrameRate && c.runFrameBurst == conversation.DefaultRunFrameBurst
		}},
		{[]string{"--refusal-delay", "0"}, nil, func(c serveConfig) bool { return c.refusalDelay < 0 }}, // none
		{nil, map[string]string{"WSGATEWAY_REFUSAL_DELAY": "2s"}, func(c serveConfig) bool { return c.refusalDelay == 2*time.Second }},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--header-timeout", "2s", "--handshake-timeout", "5s"}, nil,
			func(c serveConfig) bool {
				return c.tlsCert == "c.pem" && c.tlsKey == "k.pem" && c.headerTimeout == 2*time.Second && c.handshakeTimeout == 5*time.Second
			}},
	}
	for _, tt := range tests {
		got, err := parseServe(tt.args, env(tt.env), io.Discard)
		if err != nil || !tt.check(got) {
			t.Errorf("parseServe(%q) with env %v = %+v, %v", tt.args, tt.env, got, err)
		}
	}
	errs := []struct {
		args []string
		want string
	}{
		{[]string{"--auth", "basic"}, "want none or jwt"},
		{[]string{"--refusal-delay", "-1s"}, "must not be negative (0: none)"},
		{[]string{"--auth", "jwt"}, "--auth jwt needs exactly one of --jwt-secret-env, --jwt-key-file, --jwt-jwks-file and --jwt-jwks-url"},
		{[]string{"--auth", "jwt", "--jwt-jwks-url", "http://idp.example/jwks"}, "want an https:// URL"},
		{[]string{"--auth", "jwt", "--jwt-secret-env", "S", "--jwt-jwks-ca", "ca.pem"}, "--jwt-jwks-ca applies to --jwt-jwks-url"},
		{[]string{"--auth", "jwt", "--jwt-secret-env", "S", "--jwt-key-file", "k.pem"}, "needs exactly one"},
		{[]string{"--jwt-key-file", "k.pem"}, "--jwt-* flags need --auth jwt"},
		{[]string{"--jwt-audience", "a"}, "--jwt-* flags need --auth jwt"},
		{[]string{"--jwt-cookie", ""}, "must not be empty (use - to disable)"},
		{[]string{"--jwt-query-param", "a=b"}, `"a=b" is not a valid name`},
		{[]string{"--allowed-origins", "[bad"}, `"[bad" is not a host pattern`},
		{[]string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--read-limit", "1MB"}, "want a size such as 65536, 512KiB or 1MiB"},
		{[]string{"--read-limit", "100"}, "must be at least 1024 bytes"},
		{[]string{"--max-run-events", "0"}, "want a positive integer"},
		{[]string{"--max-socket-turns", "0"}, "want a positive integer"},
		{[]string{"--max-follows", "0"}, "want a positive integer"},
		{[]string{"--max-principal-sockets", "-1"}, "want a positive integer"},
		{[]string{"--run-frame-rate", "0"}, "want a positive number"},
		{[]string{"--run-frame-rate", "NaN"}, "want a positive number"},
		{[]string{"--run-frame-burst", "x"}, "want a positive integer"},
		{[]string{"--max-event-bytes", "2MiB", "--max-run-bytes", "1MiB"}, "--max-event-bytes 2097152 is larger than --max-run-bytes 1048576"},
		{[]string{"--header-timeout", "0s"}, "must be positive"},
		{[]string{"--takeover", "maybe"}, "want auto, on, continue or off"},
		{[]string{"--takeover", "continue"}, "the demo agent does: use --takeover on"},
		{[]string{"--agent", "openai", "--agent-url", "http://127.0.0.1:1/v1", "--agent-model", "m", "--takeover", "on"}, "use --takeover continue"},
	}
	for _, tt := range errs {
		_, err := parseServe(tt.args, env(nil), io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseServe(%q) error = %v, want errUsage containing %q", tt.args, err, tt.want)
		}
	}
}
