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
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/internal/sse"
	"github.com/wsgateway/wsgateway/protocol"
)

// Errors of New and Run. Compare with errors.Is.
var (
	ErrConfig    = errors.New("aguihttp: invalid config")
	ErrMalformed = errors.New("the upstream sent an event that is not a JSON object")
)

// Defaults of Config's zero fields.
const (
	DefaultConnectTimeout    = sse.DefaultConnectTimeout
	DefaultFirstEventTimeout = sse.DefaultFirstEventTimeout
	DefaultGapTimeout        = sse.DefaultGapTimeout
	DefaultTurnTimeout       = sse.DefaultTurnTimeout
	DefaultMaxEventBytes     = sse.DefaultMaxEventBytes
)

// excerptBytes bounds the excerpt of a malformed event in errors.
const excerptBytes = 120

// Config describes the upstream AG-UI server. URL is required; zero fields mean the defaults.
type Config struct {
	// URL is the endpoint the RunAgentInput is POSTed to (http or https).
	URL string
	// Header is sent with every request (e.g. Authorization); Content-Type and Accept are
	// set by the agent.
	Header http.Header
	// ForwardHeaders names the headers of the client's handshake (agent.ClientHeader of
	// Run's context) copied onto the request, e.g. "Authorization" or "Cookie". A static
	// Header of the same name wins.
	ForwardHeaders []string

	ConnectTimeout    time.Duration // dial and TLS handshake (10s)
	FirstEventTimeout time.Duration // request sent → first event (60s)
	GapTimeout        time.Duration // longest silence of the stream after the first event (60s)
	TurnTimeout       time.Duration // the whole request (30m)
	MaxEventBytes     int           // one event's data (1 MiB)

	// Client, if set, sends the requests (tests); ConnectTimeout is then its business.
	Client *http.Client
}

// Agent relays turns to an AG-UI server. It is safe for concurrent use by many turns.
type Agent struct {
	url     string
	header  http.Header
	forward []string
	limits  sse.Limits
	client  *http.Client
}

// New validates cfg and returns the agent.
func New(cfg Config) (*Agent, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: URL %q is not an http(s) URL", ErrConfig, cfg.URL)
	}
	if cfg.ConnectTimeout < 0 || cfg.FirstEventTimeout < 0 || cfg.GapTimeout < 0 || cfg.TurnTimeout < 0 || cfg.MaxEventBytes < 0 {
		return nil, fmt.Errorf("%w: negative timeout or limit", ErrConfig)
	}
	client := cfg.Client
	if client == nil {
		client = sse.NewClient(cfg.ConnectTimeout)
	}
	a := &Agent{
		url:    cfg.URL,
		header: cfg.Header.Clone(),
		limits: sse.Limits{
			FirstEvent:    cfg.FirstEventTimeout,
			Gap:           cfg.GapTimeout,
			Turn:          cfg.TurnTimeout,
			MaxEventBytes: cfg.MaxEventBytes,
		},
		client: client,
	}
	for _, name := range cfg.ForwardHeaders {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		a.forward = append(a.forward, http.CanonicalHeaderKey(name))
	}
	return a, nil
}

// Run POSTs in to the server and emits its events until the stream ends. See the package
// documentation for the errors.
func (a *Agent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(in.JSON()))
	if err != nil {
		return fmt.Errorf("aguihttp: build request: %w", err)
	}
	sse.ForwardHeaders(req.Header, agent.ClientHeader(ctx), a.forward)
	for k, vs := range a.header {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	err = sse.Stream(ctx, a.client, req, a.limits, nil, func(ev sse.Event) error {
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
