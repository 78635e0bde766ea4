package sse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/internal/tracing"
)

// Errors of Stream. Compare with errors.Is. Their text is meant for the client that sees the
// turn end (the agents prefix it with their name), so it carries no package prefix and never
// names the upstream URL.
var (
	ErrConnect     = errors.New("cannot connect to the upstream")
	ErrFirstEvent  = errors.New("no event from the upstream")
	ErrStalled     = errors.New("the upstream stream stalled")
	ErrTurnTimeout = errors.New("the turn exceeded its time limit")
	ErrNotStream   = errors.New("the upstream did not answer with text/event-stream")
	ErrStream      = errors.New("reading the upstream stream")
)

// Defaults of Limits.
const (
	DefaultConnectTimeout    = 10 * time.Second
	DefaultFirstEventTimeout = 60 * time.Second
	DefaultGapTimeout        = 60 * time.Second
	DefaultTurnTimeout       = 30 * time.Minute
)

// excerptBytes is the length of the body excerpts in errors.
const excerptBytes = 200

// Limits bound one streamed request. Zero fields mean the defaults above.
type Limits struct {
	// FirstEvent bounds the wait from sending the request to the first event.
	FirstEvent time.Duration
	// Gap bounds the silence between two reads of the stream after the first event (a
	// comment line counts, so keep-alive comments keep a slow stream open).
	Gap time.Duration
	// Turn bounds the whole request.
	Turn time.Duration
	// MaxEventBytes bounds one event's data (DefaultMaxEventBytes).
	MaxEventBytes int
}

func (l Limits) withDefaults() Limits {
	if l.FirstEvent <= 0 {
		l.FirstEvent = DefaultFirstEventTimeout
	}
	if l.Gap <= 0 {
		l.Gap = DefaultGapTimeout
	}
	if l.Turn <= 0 {
		l.Turn = DefaultTurnTimeout
	}
	if l.MaxEventBytes <= 0 {
		l.MaxEventBytes = DefaultMaxEventBytes
	}
	return l
}

// StatusError is a non-2xx answer of the upstream agent.
type StatusError struct {
	Code    int    // 502
	Status  string // "502 Bad Gateway"
	Excerpt string // the start of the body, printable
}

func (e *StatusError) Error() string {
	if e.Excerpt == "" {
		return "the upstream answered " + e.Status
	}
	return "the upstream answered " + e.Status + ": " + e.Excerpt
}

// NewClient returns an HTTP client for streamed requests: connections (dial and TLS
// handshake) are bounded by connect (DefaultConnectTimeout when 0), the rest by Stream's
// Limits. Proxies come from the environment as for http.DefaultTransport.
func NewClient(connect time.Duration) *http.Client {
	if connect <= 0 {
		connect = DefaultConnectTimeout
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = connect
	return &http.Client{Transport: tr}
}

// Stream sends req (its context is replaced by ctx, bounded by lim) with client and calls each
// for every event of the answer, in order, until the stream ends (nil), each returns an error
// (that error), or a limit or ctx ends it. Redact, if not nil, is applied to the upstream's
// words before an excerpt of them goes into an error (to remove a secret the upstream may
// echo); it is given at most the first 201 bytes of a body, so it must also remove a secret
// cut short at the end of its input.
//
// Stream returns ctx's error when ctx was cancelled, so an abort is not reported as an
// upstream failure. It returns only after the response body is closed.
func Stream(ctx context.Context, client *http.Client, req *http.Request, lim Limits, redact func(string) string, each func(Event) error) error {
	lim = lim.withDefaults()
	if redact == nil {
		redact = func(s string) string { return s }
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	turnTimer := time.AfterFunc(lim.Turn, func() { cancel(ErrTurnTimeout) })
	defer turnTimer.Stop()
	wd := &watchdog{cancel: cancel}
	wd.arm(lim.FirstEvent, fmt.Errorf("%w within %v", ErrFirstEvent, lim.FirstEvent))
	defer wd.stop()

	// excerpt is the start of the upstream's words b, redacted before it is cut, so that no
	// part of a secret survives the cut.
	excerpt := func(b []byte) string { return Excerpt([]byte(redact(string(b))), excerptBytes) }

	// cause turns an error seen after ctx ended into the reason it ended.
	cause := func(err error) error {
		if parent.Err() != nil {
			return parent.Err()
		}
		if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
			return c
		}
		return err
	}

	req = req.WithContext(ctx)
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := client.Do(req)
	if err != nil {
		if c := cause(nil); c != nil {
			return c
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // its text names the URL, which may hold a secret
		}
		return fmt.Errorf("%w: %s", ErrConnect, redact(err.Error()))
	}
	defer resp.Body.Close()
	if span := trace.SpanFromContext(parent); span.IsRecording() {
		span.SetAttributes(tracing.KeyStatusCode.Int(resp.StatusCode))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, excerptBytes+1))
		if c := cause(nil); c != nil && len(body) == 0 {
			return c
		}
		return &StatusError{Code: resp.StatusCode, Status: resp.Status, Excerpt: excerpt(body)}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, excerptBytes+1))
		ct := resp.Header.Get("Content-Type")
		if ct == "" {
			ct = "no Content-Type"
		}
		return fmt.Errorf("%w (%s): %s", ErrNotStream, Excerpt([]byte(redact(ct)), 80), excerpt(body))
	}

	gap := fmt.Errorf("%w: nothing received for %v", ErrStalled, lim.Gap)
	r := NewReader(&activityReader{r: resp.Body, wd: wd, gap: lim.Gap}, lim.MaxEventBytes)
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if c := cause(nil); c != nil {
				return c
			}
			if errors.Is(err, ErrTooLarge) {
				return err
			}
			return fmt.Errorf("%w: %s", ErrStream, redact(err.Error()))
		}
		wd.seen(lim.Gap, gap)
		if err := each(ev); err != nil {
			return err
		}
	}
}

// watchdog cancels the request when its timer fires: first for the first event, then for a
// gap. Once the first event was seen, every read of the stream resets it.
type watchdog struct {
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	t       *time.Timer
	cause   error // the reason given when the timer fires
	started bool  // the first event was seen: reads reset the timer
}

func (w *watchdog) arm(d time.Duration, cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cause = cause
	w.t = time.AfterFunc(d, func() {
		w.mu.Lock()
		c := w.cause
		w.mu.Unlock()
		w.cancel(c)
	})
}

// seen records an event: from now on the gap timer runs.
func (w *watchdog) seen(gap time.Duration, cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started {
		w.started = true
		w.cause = cause
		w.t.Reset(gap)
	}
}

// read records bytes received.
func (w *watchdog) read(gap time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		w.t.Reset(gap)
	}
}

func (w *watchdog) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Stop()
}

// activityReader resets the watchdog on every read that returned bytes.
type activityReader struct {
	r   io.Reader
	wd  *watchdog
	gap time.Duration
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.wd.read(a.gap)
	}
	return n, err
}

// ErrConfig reports an invalid agent.Upstream.
var ErrConfig = errors.New("negative timeout or limit")

// Upstream sends an agent's streamed requests as its agent.Upstream configures them.
type Upstream struct {
	header  http.Header
	forward []string // canonical names
	limits  Limits
	client  *http.Client
}

// NewUpstream validates u (ErrConfig) and returns what sends its requests.
func NewUpstream(u agent.Upstream) (*Upstream, error) {
	if u.ConnectTimeout < 0 || u.FirstEventTimeout < 0 || u.GapTimeout < 0 || u.TurnTimeout < 0 || u.MaxEventBytes < 0 {
		return nil, ErrConfig
	}
	up := &Upstream{
		header: u.Header.Clone(),
		limits: Limits{FirstEvent: u.FirstEventTimeout, Gap: u.GapTimeout, Turn: u.TurnTimeout, MaxEventBytes: u.MaxEventBytes},
		client: u.Client,
	}
	if up.client == nil {
		up.client = NewClient(u.ConnectTimeout)
	}
	for _, name := range u.ForwardHeaders {
		if name = strings.TrimSpace(name); name != "" {
			up.forward = append(up.forward, http.CanonicalHeaderKey(name))
		}
	}
	return up, nil
}

// Request returns a POST of the JSON body to url asking for an event stream, with the client
// headers of ctx that are forwarded, then the static headers, then the W3C trace context of
// ctx's span (traceparent, tracestate), if any: the upstream continues the turn's trace.
func (u *Upstream) Request(ctx context.Context, url string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	client := agent.ClientHeader(ctx)
	for _, name := range u.forward {
		if vs := client.Values(name); len(vs) > 0 {
			req.Header[name] = append([]string(nil), vs...)
		}
	}
	for k, vs := range u.header {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	tracing.Inject(ctx, req.Header)
	return req, nil
}

// CloseIdleConnections closes the idle connections of the upstream's client.
func (u *Upstream) CloseIdleConnections() { u.client.CloseIdleConnections() }

// Stream is the package's Stream with the upstream's client and limits.
func (u *Upstream) Stream(ctx context.Context, req *http.Request, redact func(string) string, each func(Event) error) error {
	return Stream(ctx, u.client, req, u.limits, redact, each)
}
