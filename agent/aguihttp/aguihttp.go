// Package aguihttp is the agent that relays a turn to an AG-UI server over the standard HTTP
// transport: it POSTs the turn's RunAgentInput as JSON with Accept: text/event-stream and
// emits the data of every server-sent event as one AG-UI event.
//
// New(Config) validates the configuration; Agent.Run implements the agent contract of package
// turn (see package agent). The turn's pipeline checks what the server sends (schema, chunk
// expansion, verification), so Run relays events as they are, and only refuses what is not
// one JSON object.
//
// Run returns an error, which the turn reports as RUN_ERROR (code agent_error) whose message
// is the error's text, when the server answers with a non-2xx status (the status and a short
// excerpt of the body), answers something other than an event stream, sends an event that is
// not a JSON object (an excerpt of it) or larger than MaxEventBytes, sends no event within
// FirstEventTimeout, falls silent for GapTimeout, or the turn exceeds TurnTimeout. The
// messages never name the upstream URL. A stream that ends without a terminal event is
// ended by the turn (RUN_ERROR code incomplete). Cancelling Run's context (an abort) cancels
// the upstream request at once.
package aguihttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/internal/sse"
	"github.com/wsgateway/wsgateway/protocol"
)

// Errors of New and Run. Compare with errors.Is.
var (
	ErrConfig    = errors.New("aguihttp: invalid config")
	ErrMalformed = errors.New("the upstream sent an event that is not a JSON object")
)

// excerptBytes bounds the excerpt of a malformed event in errors.
const excerptBytes = 120

// Config describes the upstream AG-UI server. URL is required; zero fields mean the defaults.
type Config struct {
	// URL is the endpoint the RunAgentInput is POSTed to (http or https).
	URL string
	// Upstream sets the headers, timeouts and event size limit.
	agent.Upstream
}

// Agent relays turns to an AG-UI server. It is safe for concurrent use by many turns.
type Agent struct {
	url string
	up  *sse.Upstream
}

// New validates cfg and returns the agent.
func New(cfg Config) (*Agent, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: URL %q is not an http(s) URL", ErrConfig, cfg.URL)
	}
	up, err := sse.NewUpstream(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Agent{url: cfg.URL, up: up}, nil
}

// Run POSTs in to the server and emits its events until the stream ends. See the package
// documentation for the errors.
func (a *Agent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error {
	req, err := a.up.Request(ctx, a.url, in.JSON())
	if err != nil {
		return fmt.Errorf("aguihttp: build request: %w", err)
	}
	err = a.up.Stream(ctx, req, nil, func(ev sse.Event) error {
		data := bytes.TrimSpace([]byte(ev.Data))
		if len(data) == 0 || data[0] != '{' || !json.Valid(data) {
			return fmt.Errorf("%w: %s", ErrMalformed, sse.Excerpt(data, excerptBytes))
		}
		if err := emit(data); err != nil {
			return fmt.Errorf("%w: %w", errEmit, err)
		}
		return nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errEmit):
		return err
	}
	return fmt.Errorf("%s: %w", Prefix, err)
}

// Prefix starts the message of every upstream failure Run reports (the RUN_ERROR message).
const Prefix = "agui agent"

// errEmit marks an error of the turn's emit function.
var errEmit = errors.New("aguihttp: emit")
