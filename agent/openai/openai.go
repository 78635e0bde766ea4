// Package openai is the agent that answers a turn with an OpenAI-compatible Chat Completions
// server (OpenAI, vLLM, llama.cpp's server, Ollama, and the others that copy its API),
// streaming (stream: true).
//
// New(Config) validates the configuration; Agent.Run implements the agent contract of package
// turn (see package agent).
//
// The request (Request) is built from the turn's RunAgentInput: the model of Config; the
// context entries as one leading system message; the messages (system and developer as
// system, user with its text and image parts, assistant with its tool calls, tool results;
// activity and reasoning messages are not sent); the tools as functions; stream_options
// include_usage.
//
// The streamed answer becomes AG-UI events, in this order of appearance:
//
//	RUN_STARTED{threadId, runId}                   before the request is sent
//	REASONING_START, REASONING_MESSAGE_START/…     for reasoning deltas (reasoning_content or
//	  CONTENT/END, REASONING_END                   reasoning), ended when anything else comes
//	TEXT_MESSAGE_START/CONTENT/END                 for content deltas (role assistant)
//	TOOL_CALL_START/ARGS/END                       for tool_calls deltas, one call per index,
//	                                               its arguments fragments as ARGS, ended
//	                                               when the choice finishes
//	RUN_FINISHED{threadId, runId, result,          at [DONE]; result is {"finishReason": …},
//	  usage}                                       usage the server's token counts
//
// Ids derive from the runId: "<runId>.reasoning<n>" (span), "<runId>.thought<n>" (reasoning
// message), "<runId>.msg<n>" (text), and the server's tool call ids ("<runId>.call<index>"
// when it sends none).
//
// Run returns an error, reported by the turn as RUN_ERROR (code agent_error) with the error's
// text, for a non-2xx answer (status and an excerpt of the body), an error object in the
// stream (its message), a malformed chunk, a stream that ends before [DONE] and a finish
// reason, and the timeouts and limits of Config. The API key is sent as a bearer token and
// removed from every excerpt; it never appears in an error.
package openai

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/internal/sse"
	"github.com/wsgateway/wsgateway/protocol"
)

// Errors of New and Run. Compare with errors.Is.
var (
	ErrConfig     = errors.New("openai: invalid config")
	ErrProvider   = errors.New("the provider reported an error")
	ErrMalformed  = errors.New("the upstream sent a chunk that is not a chat completion chunk")
	ErrCutShort   = errors.New("the upstream stream ended before [DONE]")
	ErrToolName   = errors.New("the upstream sent a tool call without a name")
	ErrToolCallID = errors.New("the upstream sent a second tool call with the id")
)

// Prefix starts the message of every upstream failure Run reports (the RUN_ERROR message).
const Prefix = "openai agent"

// excerptBytes bounds the excerpts of the upstream's words in errors.
const excerptBytes = 200

// Config describes the upstream server. BaseURL and Model are required; zero fields mean the
// defaults.
type Config struct {
	// BaseURL is the API base ("https://api.openai.com/v1", "http://127.0.0.1:11434/v1");
	// requests go to BaseURL + "/chat/completions" (unless it already ends so).
	BaseURL string
	// Model is the request's model.
	Model string
	// APIKey, if set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// Upstream sets the headers, timeouts and event size limit; the API key is set after
	// its headers.
	agent.Upstream
}

// Agent answers turns with a Chat Completions server. It is safe for concurrent use.
type Agent struct {
	url   string
	model string
	key   string
	up    *sse.Upstream
}

// New validates cfg and returns the agent.
func New(cfg Config) (*Agent, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: base URL %q is not an http(s) URL", ErrConfig, cfg.BaseURL)
	}
	if strings.TrimSpace(cfg.Model) == "" {
		return nil, fmt.Errorf("%w: no model", ErrConfig)
	}
	up, err := sse.NewUpstream(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	endpoint := strings.TrimRight(cfg.BaseURL, "/")
	if !strings.HasSuffix(endpoint, "/chat/completions") {
		endpoint += "/chat/completions"
	}
	return &Agent{url: endpoint, model: cfg.Model, key: cfg.APIKey, up: up}, nil
}

// errDone ends the stream at [DONE].
var errDone = errors.New("openai: done")

// errEmit marks an error of the turn's emit function.
var errEmit = errors.New("openai: emit")

// Run sends the turn to the server and emits its answer as AG-UI events.
func (a *Agent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error {
	body, err := Request(a.model, in)
	if err != nil {
		return fmt.Errorf("%s: %w", Prefix, err)
	}
	req, err := a.up.Request(ctx, a.url, body)
	if err != nil {
		return fmt.Errorf("openai: build request: %w", err)
	}
	if a.key != "" {
		req.Header.Set("Authorization", "Bearer "+a.key)
	}

	c := &converter{in: in, model: a.model, emit: func(ev []byte) error {
		if err := emit(ev); err != nil {
			return fmt.Errorf("%w: %w", errEmit, err)
		}
		return nil
	}}
	if err := c.start(); err != nil {
		return err
	}
	err = a.up.Stream(ctx, req, a.redact, func(ev sse.Event) error {
		return c.event(ev, a.redact)
	})
	switch {
	case errors.Is(err, errDone):
		err = nil
	case err == nil:
		err = c.eof()
	}
	switch {
	case err == nil:
		return c.finish()
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errEmit):
		return err
	}
	return fmt.Errorf("%s: %w", Prefix, err)
}

// redact removes the API key from s, and the start of it (4 bytes or more) that may end s
// when s was cut short.
func (a *Agent) redact(s string) string {
	if a.key == "" {
		return s
	}
	s = strings.ReplaceAll(s, a.key, "[redacted]")
	for n := len(a.key) - 1; n >= 4; n-- {
		if strings.HasSuffix(s, a.key[:n]) {
			return s[:len(s)-n] + "[redacted]"
		}
	}
	return s
}
