package main

import (
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestParseServeAgents checks the flags of the agui and openai agents, from flags and from
// their environment variables.
func TestParseServeAgents(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(serveConfig) bool
	}{
		{"agui", []string{"--agent", "agui", "--agent-url", "http://127.0.0.1:8000/agent"}, nil,
			func(c serveConfig) bool { return c.agent == "agui" && c.agentURL == "http://127.0.0.1:8000/agent" }},
		{"headers, repeated", []string{"--agent", "agui", "--agent-url", "https://up/agent",
			"--agent-header", "X-Api-Key: k1", "--agent-header", "x-team:  blue ", "--agent-header", "X-Api-Key: k2"}, nil,
			func(c serveConfig) bool {
				return reflect.DeepEqual(c.agentHeader, http.Header{"X-Api-Key": {"k1", "k2"}, "X-Team": {"blue"}})
			}},
		{"headers from the environment, one per line", nil, map[string]string{
			"WSGATEWAY_AGENT": "agui", "WSGATEWAY_AGENT_URL": "http://up/a",
			"WSGATEWAY_AGENT_HEADER": "Authorization: Bearer t\nX-A: 1, 2\n",
		}, func(c serveConfig) bool {
			return reflect.DeepEqual(c.agentHeader, http.Header{"Authorization": {"Bearer t"}, "X-A": {"1, 2"}})
		}},
		{"forwarded headers", []string{"--agent", "agui", "--agent-url", "http://up/a", "--agent-forward-headers", "authorization, x-user-id"}, nil,
			func(c serveConfig) bool {
				return reflect.DeepEqual(c.agentForward, []string{"Authorization", "X-User-Id"})
			}},
		{"timeouts", []string{"--agent", "agui", "--agent-url", "http://up/a", "--agent-connect-timeout", "2s",
			"--agent-first-event-timeout", "3s", "--agent-gap-timeout", "4s", "--agent-turn-timeout", "5m"}, nil,
			func(c serveConfig) bool {
				return c.agentConnectTimeout == 2*time.Second && c.agentFirstEvent == 3*time.Second &&
					c.agentGapTimeout == 4*time.Second && c.agentTurnTimeout == 5*time.Minute
			}},
		{"openai with the default key variable", []string{"--agent", "openai", "--agent-url", "https://api.openai.com/v1", "--agent-model", "gpt-4o-mini"},
			map[string]string{"OPENAI_API_KEY": "sk-test"},
			func(c serveConfig) bool { return c.agentModel == "gpt-4o-mini" && c.agentAPIKey == "sk-test" }},
		{"openai with another key variable", []string{"--agent", "openai", "--agent-url", "http://127.0.0.1:11434/v1", "--agent-model", "llama3.2", "--agent-api-key-env", "MY_KEY"},
			map[string]string{"OPENAI_API_KEY": "sk-other", "MY_KEY": "sk-mine"},
			func(c serveConfig) bool { return c.agentAPIKeyEnv == "MY_KEY" && c.agentAPIKey == "sk-mine" }},
		{"openai without a key", []string{"--agent", "openai", "--agent-url", "http://127.0.0.1:11434/v1", "--agent-model", "llama3.2"}, nil,
			func(c serveConfig) bool { return c.agentAPIKey == "" }},
		{"the agui agent reads no key", []string{"--agent", "agui", "--agent-url", "http://up/a"}, map[string]string{"OPENAI_API_KEY": "sk-test"},
			func(c serveConfig) bool { return c.agentAPIKey == "" }},
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

func TestParseServeAgentErrors(t *testing.T) {
	agui := []string{"--agent", "agui", "--agent-url", "http://up/a"}
	tests := []struct {
		args []string
		env  map[string]string
		want string // in the error message
	}{
		{[]string{"--agent", "agui", "--agent-url", "ftp://up/a"}, nil, `"ftp://up/a" is not an http(s) URL`},
		{[]string{"--agent", "openai", "--agent-url", "http://up/v1"}, nil, "--agent openai needs --agent-model"},
		{append(agui, "--agent-model", "m"), nil, "--agent-model is used only with --agent openai"},
		{[]string{"--agent-header", "X-A: 1"}, nil, "used only with --agent agui or openai"},
		{[]string{"--agent-forward-headers", "Cookie"}, nil, "used only with --agent agui or openai"},
		{append(agui, "--agent-header", "no colon"), nil, `want "Name: value"`},
		{append(agui, "--agent-header", "Bad Name: 1"), nil, `want "Name: value"`},
		{append(agui, "--agent-forward-headers", "Host"), nil, "Host is a header of the handshake itself"},
		{append(agui, "--agent-forward-headers", "sec-websocket-key"), nil, "Sec-Websocket-Key is a header of the handshake itself"},
		{append(agui, "--agent-forward-headers", "a b"), nil, `"a b" is not a header name`},
		{append(agui, "--agent-gap-timeout", "0s"), nil, "must be positive"},
		{append(agui, "--agent-api-key-env", "A=B"), nil, "want the name of an environment variable"},
	}
	for _, tt := range tests {
		_, err := parseServe(tt.args, env(tt.env), io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseServe(%q) error = %v, want errUsage containing %q", tt.args, err, tt.want)
		}
	}
}

// TestAgentKeyNotInErrors: the API key is held for the agent only; it appears in no error
// of the command line, even a wrong one.
func TestAgentKeyNotInErrors(t *testing.T) {
	_, err := parseServe([]string{"--agent", "openai", "--agent-url", "http://up/v1"}, env(map[string]string{"OPENAI_API_KEY": "sk-hidden"}), io.Discard)
	if err == nil || strings.Contains(err.Error(), "sk-hidden") {
		t.Errorf("parseServe error = %v; want an error without the key", err)
	}
}
