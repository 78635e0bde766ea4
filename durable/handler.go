package durable

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/wsgateway/wsgateway/internal/jsoncompact"
	"github.com/wsgateway/wsgateway/internal/origin"
	"github.com/wsgateway/wsgateway/internal/quota"
)

// Config configures a Handler. Zero fields mean the documented defaults.
type Config struct {
	// Conn and JetStream are the NATS connection and its JetStream handle (required); the
	// Handler does not close them.
	Conn      *nats.Conn
	JetStream natsjs.JetStream

	// Prefix is the URL path the streams are under (default "/v1/stream"): a stream's name
	// is the rest of the path.
	Prefix string
	// AltPrefix is a second prefix whose rest is one path segment, the name URL-encoded
	// (default "/streams", the TanStack adapter's shape; "-" turns it off).
	AltPrefix string

	// Stream names the JetStream stream (default "WSGATEWAY_DS"), Subject its subject
	// prefix (default "wsgateway.ds") and Bucket the metadata bucket (default "wsgateway_ds").
	Stream, Subject, Bucket string
	// Replicas of the stream and bucket (default 1).
	Replicas int
	// Retention bounds every stream's life from its last write (default 24h).
	Retention time.Duration

	// LongPollTimeout is how long a long-poll waits for data before 204, and the interval
	// of SSE keep-alive control events (default 20s).
	LongPollTimeout time.Duration
	// MaxBodyBytes caps a PUT or POST body (default 1 MiB, at most the NATS max payload less
	// 4 KiB); a larger one is answered 413.
	MaxBodyBytes int64
	// MaxReadBytes caps the data of one catch-up response (default 1 MiB): a longer log is
	// read in several requests.
	MaxReadBytes int

	// Principal names the caller; an error answers 401. Default: everyone is "anonymous".
	// A stream belongs to its principal: another one's streams do not exist for a caller.
	Principal func(*http.Request) (string, error)
	// Cookie names the cookie Principal may take the token from ("": none). A request that
	// carries it and no Authorization header, from a browser origin that origin.Allowed
	// refuses with OriginPatterns, is answered 403: a page of another site would otherwise
	// write and read with the user's cookie (a simple POST needs no preflight).
	Cookie         string
	OriginPatterns []string
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger

	// MaxReaders caps the reads (GET: catch-up, long-poll, SSE) one principal has in
	// progress at once on this Handler (default DefaultMaxReaders); beyond it a read is
	// answered 429 MsgTooManyReaders before anything is loaded. PrincipalReaders gives named
	// principals another cap. Without a Principal function everyone is one principal, and
	// no cap applies.
	MaxReaders       int
	PrincipalReaders map[string]int
	// Refused, if set, is called for each read refused by MaxReaders (a metric).
	Refused func()
	// RefusalDelay is how long a refusal by MaxReaders waits before its 429 (default
	// quota.DefaultPause; negative: none): see quota.Pause.
	RefusalDelay time.Duration
}

// DefaultMaxReaders: each chat a page shows holds one live read; a person's tabs stay far
// below it.
const DefaultMaxReaders = 16

// MsgTooManyReaders is the body of the 429 answer to a read beyond Config.MaxReaders.
const MsgTooManyReaders = "max-principal-readers: too many reads at once for this principal"

func (c Config) withDefaults() (Config, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Prefix, "/v1/stream")
	def(&c.AltPrefix, "/streams")
	def(&c.Stream, "WSGATEWAY_DS")
	def(&c.Subject, "wsgateway.ds")
	def(&c.Bucket, "wsgateway_ds")
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.LongPollTimeout == 0 {
		c.LongPollTimeout = 20 * time.Second
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.Conn != nil && c.MaxBodyBytes > c.Conn.MaxPayload()-4096 {
		c.MaxBodyBytes = c.Conn.MaxPayload() - 4096
	}
	if c.MaxReadBytes == 0 {
		c.MaxReadBytes = 1 << 20
	}
	if c.MaxReaders == 0 {
		c.MaxReaders = DefaultMaxReaders
	}
	if c.RefusalDelay == 0 {
		c.RefusalDelay = quota.DefaultPause
	}
	if c.Principal == nil {
		c.Principal = func(*http.Request) (string, error) { return "anonymous", nil }
		c.MaxReaders, c.PrincipalReaders = math.MaxInt, nil // one principal: no cap
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Prefix = strings.TrimSuffix(c.Prefix, "/")
	c.AltPrefix = strings.TrimSuffix(c.AltPrefix, "/")
	switch {
	case c.Conn == nil || c.JetStream == nil:
		return c, errors.New("durable: Conn and JetStream are required")
	case !strings.HasPrefix(c.Prefix, "/") || (c.AltPrefix != "-" && !strings.HasPrefix(c.AltPrefix, "/")):
		return c, errors.New("durable: prefixes must start with /")
	case c.LongPollTimeout < 0 || c.Retention < 0 || c.MaxBodyBytes < 1 || c.MaxReadBytes < 1 || c.MaxReaders < 0:
		return c, errors.New("durable: negative or zero limit in config")
	}
	return c, nil
}

// Handler serves the protocol. It is safe for concurrent use.
type Handler struct {
	cfg  Config
	st   *store
	done chan struct{} // closed by Close: live reads end
	once sync.Once
	// readers counts each principal's reads in progress (Config.MaxReaders).
	readers quota.Counts
}

// Close ends the live reads (long-polls answer 204, SSE responses end) so that an HTTP
// server's Shutdown is not held by them; later live reads end at once. It does not block and
// is idempotent; register it with http.Server.RegisterOnShutdown.
func (h *Handler) Close() {
	h.once.Do(func() { close(h.done) })
}

// New creates or updates the stream and bucket and returns the handler.
func New(ctx context.Context, cfg Config) (*Handler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	st, err := newStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, st: st, done: make(chan struct{})}, nil
}

// Patterns returns the net/http.ServeMux patterns to register the handler under.
func (h *Handler) Patterns() []string {
	var out []string
	for _, p := range []string{h.cfg.Prefix, h.cfg.AltPrefix} {
		if p == "-" {
			continue
		}
		for _, m := range []string{"GET", "PUT", "POST", "DELETE", "OPTIONS"} {
			out = append(out, m+" "+p+"/")
		}
	}
	return out
}

// Protocol headers.
const (
	hOffset        = "Stream-Next-Offset"
	hCursor        = "Stream-Cursor"
	hUpToDate      = "Stream-Up-To-Date"
	hClosed        = "Stream-Closed"
	hSeq           = "Stream-Seq"
	hTTL           = "Stream-TTL"
	hExpiresAt     = "Stream-Expires-At"
	hForkedFrom    = "Stream-Forked-From"
	hForkOffset    = "Stream-Fork-Offset"
	hForkSubOffset = "Stream-Fork-Sub-Offset"
	hProducerID    = "Producer-Id"
	hProducerEpoch = "Producer-Epoch"
	hProducerSeq   = "Producer-Seq"
	hExpectedSeq   = "Producer-Expected-Seq"
	hReceivedSeq   = "Producer-Received-Seq"
	hSSEEncoding   = "Stream-SSE-Data-Encoding"
)

// name returns the stream name of a request path, or "" when it names none.
func (h *Handler) name(path string) string {
	for _, p := range []string{h.cfg.Prefix, h.cfg.AltPrefix} {
		if p != "-" && strings.HasPrefix(path, p+"/") {
			return path[len(p)+1:]
		}
	}
	return ""
}

// crossSiteCookie reports whether r would be authenticated by Config.Cookie from a browser
// origin the gateway does not allow.
func (h *Handler) crossSiteCookie(r *http.Request) bool {
	if h.cfg.Cookie == "" || r.Header.Get("Authorization") != "" {
		return false
	}
	if _, err := r.Cookie(h.cfg.Cookie); err != nil {
		return false
	}
	return !origin.Allowed(r, h.cfg.OriginPatterns)
}

// ServeHTTP serves one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Access-Control-Allow-Origin", "*")
	hd.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, HEAD, OPTIONS")
	hd.Set("Access-Control-Allow-Headers", "content-type, authorization, if-none-match, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset")
	hd.Set("Access-Control-Expose-Headers", "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, etag, content-type, content-encoding, location, vary")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cross-Origin-Resource-Policy", "cross-origin")
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if h.crossSiteCookie(r) {
		http.Error(w, "cross-origin request with a cookie", http.StatusForbidden)
		return
	}
	name := h.name(r.URL.Path)
	if name == "" {
		http.Error(w, "no stream name", http.StatusNotFound)
		return
	}
	principal, err := h.cfg.Principal(r)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	switch r.Method {
	case http.MethodPut:
		h.create(w, r, principal, name)
	case http.MethodPost:
		h.append(w, r, principal, name)
	case http.MethodGet:
		if !h.holdReader(w, r, principal) {
			return
		}
		defer h.readers.Put(principal)
		h.read(w, r, principal, name)
	case http.MethodHead:
		h.head(w, r, principal, name)
	case http.MethodDelete:
		if err := h.st.delete(r.Context(), key(principal, name)); err != nil {
			h.fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// holdReader takes one of principal's reads (Config.MaxReaders), or answers r 429 after
// Config.RefusalDelay and reports false.
func (h *Handler) holdReader(w http.ResponseWriter, r *http.Request, principal string) bool {
	max := h.cfg.MaxReaders
	if n, ok := h.cfg.PrincipalReaders[principal]; ok && n > 0 {
		max = n
	}
	if h.readers.Take(principal, max) {
		return true
	}
	if h.cfg.Refused != nil {
		h.cfg.Refused()
	}
	quota.Pause(r.Context(), h.cfg.RefusalDelay)
	http.Error(w, MsgTooManyReaders, http.StatusTooManyRequests)
	return false
}

// fail answers err with its status.
func (h *Handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var maxErr *http.MaxBytesError
	switch {
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrGone):
		code = http.StatusGone
	case errors.Is(err, ErrExists), errors.Is(err, ErrForksBlock), errors.Is(err, ErrContentType),
		errors.Is(err, ErrSeqConflict), errors.Is(err, ErrStreamClosed):
		code = http.StatusConflict
	case errors.Is(err, ErrForkOffset), errors.Is(err, ErrForkSubOffset), errors.Is(err, errBadRequest):
		code = http.StatusBadRequest
	case errors.As(err, &maxErr):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrBusy):
		code = http.StatusServiceUnavailable
	case errors.Is(err, context.Canceled):
		return
	default:
		h.cfg.Logger.Warn("durable streams: request failed", "err", err)
	}
	http.Error(w, strings.TrimPrefix(err.Error(), "durable: "), code)
}

var errBadRequest = errors.New("durable: bad request")

func badRequest(msg string) error { return fmt.Errorf("%w: %s", errBadRequest, msg) }

var (
	ttlPattern    = regexp.MustCompile(`^(0|[1-9][0-9]{0,15})$`)
	digitsPattern = regexp.MustCompile(`^[0-9]{1,16}$`)
	mediaPattern  = regexp.MustCompile(`^[\w-]+/[\w.+-]+`)
)

// buffers recycles the buffers a PUT or POST body is read and compacted into: a publish
// copies its message into the NATS connection's buffer, so they are free once the request
// is answered (two large allocations less per append: about a tenth of its CPU,
// BenchmarkAppend).
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooled bounds the capacity of a buffer kept for reuse.
const maxPooled = 2 << 20

// getBuffer returns an empty buffer; putBuffer gives it back once nothing refers to its bytes.
func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooled {
		b.Reset()
		buffers.Put(b)
	}
}

// body reads a request body within the limit into buf, grown to its announced length.
func (h *Handler) body(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) ([]byte, error) {
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return nil, &http.MaxBytesError{Limit: h.cfg.MaxBodyBytes}
	}
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	return buf.Bytes(), err
}

// jsonBody returns a JSON-mode body in stored form, written in out's storage: one value, or
// an array's elements, compacted and joined by commas. An empty array is refused unless
// allowEmpty. It is one pass over the body: compacting validates, and the compacted array
// less its brackets is its elements joined by commas.
func jsonBody(b []byte, allowEmpty bool, out *bytes.Buffer) ([]byte, error) {
	out.Grow(len(b))
	c, ok := jsoncompact.Append(out.AvailableBuffer(), b)
	if !ok {
		return nil, badRequest("invalid JSON")
	}
	if c[0] == '[' {
		c = c[1 : len(c)-1]
	}
	if len(c) == 0 {
		if allowEmpty {
			return nil, nil
		}
		return nil, badRequest("empty arrays are not allowed")
	}
	return c, nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, principal, name string) {
	q := createRequest{ContentType: r.Header.Get("Content-Type")}
	forkFrom := r.Header.Get(hForkedFrom)
	if !mediaPattern.MatchString(q.ContentType) {
		q.ContentType = ""
		if forkFrom == "" {
			q.ContentType = "application/octet-stream"
		}
	}
	ttl, exp := r.Header.Get(hTTL), r.Header.Get(hExpiresAt)
	if ttl != "" && exp != "" {
		h.fail(w, badRequest("Stream-TTL and Stream-Expires-At together"))
		return
	}
	if ttl != "" {
		if !ttlPattern.MatchString(ttl) {
			h.fail(w, badRequest("invalid Stream-TTL"))
			return
		}
		q.HasTTL = true
		q.TTL, _ = strconv.ParseInt(ttl, 10, 64)
	}
	if exp != "" {
		t, err := parseTime(exp)
		if err != nil {
			h.fail(w, badRequest("invalid Stream-Expires-At"))
			return
		}
		q.ExpiresAt, q.Expires = exp, t.UnixMilli()
		if q.Expires == 0 {
			q.Expires = -1
		}
	}
	q.Closed = r.Header.Get(hClosed) == "true"
	if forkFrom != "" {
		if n := h.name(forkFrom); n != "" {
			forkFrom = n
		}
		q.ForkFrom = strings.TrimPrefix(forkFrom, "/")
	}
	if off := r.Header.Get(hForkOffset); off != "" {
		seq, ok := parseOffset(off)
		if !ok {
			h.fail(w, badRequest("invalid Stream-Fork-Offset"))
			return
		}
		q.ForkOffset = &seq
	}
	if sub, ok := r.Header[http.CanonicalHeaderKey(hForkSubOffset)]; ok {
		if forkFrom == "" {
			h.fail(w, badRequest("Stream-Fork-Sub-Offset without Stream-Forked-From"))
			return
		}
		if len(sub) != 1 || !digitsPattern.MatchString(sub[0]) || (len(sub[0]) > 1 && sub[0][0] == '0') {
			h.fail(w, badRequest("invalid Stream-Fork-Sub-Offset"))
			return
		}
		q.ForkSub, _ = strconv.Atoi(sub[0])
		if q.ForkSub > 0 && q.ForkOffset == nil {
			h.fail(w, badRequest("Stream-Fork-Sub-Offset needs Stream-Fork-Offset"))
			return
		}
	}
	raw, compact := getBuffer(), getBuffer()
	defer putBuffer(raw)
	defer putBuffer(compact)
	body, err := h.body(w, r, raw)
	if err != nil {
		h.fail(w, err)
		return
	}
	if len(body) > 0 {
		ct := q.ContentType
		if ct == "" && q.ForkFrom != "" {
			if src, _, err := h.st.load(r.Context(), key(principal, q.ForkFrom)); err == nil {
				ct = src.ContentType
			}
		}
		if isJSON(ct) {
			if body, err = jsonBody(body, true, compact); err != nil {
				h.fail(w, err)
				return
			}
		}
	}
	q.Body = body
	m, created, err := h.st.create(r.Context(), principal, name, q)
	if err != nil {
		h.fail(w, err)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", m.ContentType)
	hd.Set(hOffset, formatOffset(m.Tail))
	if m.Closed {
		hd.Set(hClosed, "true")
	}
	if created {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		hd.Set("Location", scheme+"://"+r.Host+r.URL.EscapedPath())
		w.WriteHeader(http.StatusCreated)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// parseTime parses an RFC 3339 time (the ISO 8601 form clients send).
func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999Z0700", "2006-01-02T15:04:05Z07"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errBadRequest
}

func (h *Handler) append(w http.ResponseWriter, r *http.Request, principal, name string) {
	q := appendRequest{ContentType: r.Header.Get("Content-Type"), Close: r.Header.Get(hClosed) == "true",
		Seq: r.Header.Get(hSeq)}
	id, hasID := r.Header[http.CanonicalHeaderKey(hProducerID)]
	epoch, hasEpoch := r.Header[http.CanonicalHeaderKey(hProducerEpoch)]
	pseq, hasPSeq := r.Header[http.CanonicalHeaderKey(hProducerSeq)]
	if hasID || hasEpoch || hasPSeq {
		if !hasID || !hasEpoch || !hasPSeq {
			h.fail(w, badRequest("Producer-Id, Producer-Epoch and Producer-Seq go together"))
			return
		}
		if id[0] == "" {
			h.fail(w, badRequest("empty Producer-Id"))
			return
		}
		e, err1 := parseCount(epoch[0])
		s, err2 := parseCount(pseq[0])
		if err1 != nil || err2 != nil {
			h.fail(w, badRequest("Producer-Epoch and Producer-Seq must be non-negative integers"))
			return
		}
		q.Producer = &producerTuple{ID: id[0], Epoch: e, Seq: s}
	}
	raw, compact := getBuffer(), getBuffer()
	defer putBuffer(raw)
	defer putBuffer(compact)
	body, err := h.body(w, r, raw)
	if err != nil {
		h.fail(w, err)
		return
	}
	if len(body) == 0 && !q.Close {
		h.fail(w, badRequest("empty body"))
		return
	}
	if len(body) > 0 {
		if q.ContentType == "" {
			h.fail(w, badRequest("Content-Type is required"))
			return
		}
		if isJSON(q.ContentType) {
			if body, err = jsonBody(body, false, compact); err != nil {
				h.fail(w, err)
				return
			}
		}
	}
	q.Body = body
	res, err := h.st.append(r.Context(), principal, name, q)
	hd := w.Header()
	if errors.Is(err, ErrStreamClosed) {
		hd.Set(hClosed, "true")
		hd.Set(hOffset, formatOffset(res.Offset))
	}
	if err != nil {
		h.fail(w, err)
		return
	}
	p := q.Producer
	switch res.Status {
	case appendAccepted, appendDuplicate:
		hd.Set(hOffset, formatOffset(res.Offset))
		if res.Closed {
			hd.Set(hClosed, "true")
		}
		code := http.StatusNoContent
		if p != nil {
			hd.Set(hProducerEpoch, strconv.FormatUint(p.Epoch, 10))
			if res.Status == appendDuplicate {
				hd.Set(hProducerSeq, strconv.FormatUint(res.Seq, 10))
			} else {
				hd.Set(hProducerSeq, strconv.FormatUint(p.Seq, 10))
				if len(q.Body) > 0 {
					code = http.StatusOK
				}
			}
		}
		w.WriteHeader(code)
	case appendStaleEpoch:
		hd.Set(hProducerEpoch, strconv.FormatUint(res.Epoch, 10))
		http.Error(w, "stale producer epoch", http.StatusForbidden)
	case appendEpochSeq:
		http.Error(w, "a new epoch must start with sequence 0", http.StatusBadRequest)
	case appendSeqGap:
		hd.Set(hExpectedSeq, strconv.FormatUint(res.Expected, 10))
		hd.Set(hReceivedSeq, strconv.FormatUint(p.Seq, 10))
		http.Error(w, "producer sequence gap", http.StatusConflict)
	}
}

// parseCount parses a non-negative decimal integer below 2^53 (JavaScript's safe range).
func parseCount(s string) (uint64, error) {
	if !digitsPattern.MatchString(s) {
		return 0, errBadRequest
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > 1<<53-1 {
		return 0, errBadRequest
	}
	return n, nil
}

// loadLive loads a stream for a read: absent, soft-deleted or expired is an error; a TTL
// stream's life is renewed.
func (h *Handler) loadLive(ctx context.Context, k string, touch bool) (meta, error) {
	m, rev, err := h.st.load(ctx, k)
	if err != nil {
		return m, err
	}
	if m.Deleted {
		return m, ErrGone
	}
	if touch {
		h.st.touch(ctx, k, m, rev)
	}
	return m, nil
}

func (h *Handler) head(w http.ResponseWriter, r *http.Request, principal, name string) {
	m, err := h.loadLive(r.Context(), key(principal, name), false)
	if err != nil {
		h.fail(w, err)
		return
	}
	hd := w.Header()
	hd.Set(hOffset, formatOffset(m.Tail))
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Type", m.ContentType)
	if m.Closed {
		hd.Set(hClosed, "true")
	}
	if m.HasTTL {
		hd.Set(hTTL, strconv.FormatInt(m.TTL, 10))
	}
	if m.ExpiresAt != "" {
		hd.Set(hExpiresAt, m.ExpiresAt)
	}
	hd.Set("ETag", etag(r.URL.Path, "-1", formatOffset(m.Tail), m.Closed))
	w.WriteHeader(http.StatusOK)
}

func etag(path, start, end string, closed bool) string {
	c := ""
	if closed {
		c = ":c"
	}
	return `"` + base64.StdEncoding.EncodeToString([]byte(path)) + ":" + start + ":" + end + c + `"`
}

// Cursors (protocol section 8.1): 20 s intervals since 2024-10-09, advanced with jitter when
// the client's is not behind.
var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

const cursorInterval = 20 * time.Second

func cursor(client string, now time.Time) string {
	cur := int64(now.Sub(cursorEpoch) / cursorInterval)
	c, err := strconv.ParseInt(client, 10, 64)
	if client == "" || err != nil || c < cur {
		return strconv.FormatInt(cur, 10)
	}
	jitter := (1 + rand.Int64N(3600)) * int64(time.Second)
	return strconv.FormatInt(c+max(1, (jitter+int64(cursorInterval)-1)/int64(cursorInterval)), 10)
}

// waiter wakes on the updates of one stream's metadata.
type waiter struct {
	sub *nats.Subscription
	ch  chan *nats.Msg
}

func (h *Handler) watch(k string) (*waiter, error) {
	wt := &waiter{ch: make(chan *nats.Msg, 16)}
	var err error
	wt.sub, err = h.st.nc.ChanSubscribe(h.st.kvSubject(k), wt.ch)
	return wt, err
}

func (wt *waiter) stop() { wt.sub.Unsubscribe() }

// wait returns the stream's metadata after its next update, ErrNotFound when it was
// deleted or replaced, or ok false on timeout or when done is closed.
func (wt *waiter) wait(ctx context.Context, done <-chan struct{}, id string, timeout time.Duration) (m meta, ok bool, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return m, false, ctx.Err()
		case <-done:
			return m, false, nil
		case <-t.C:
			return m, false, nil
		case msg := <-wt.ch:
			if op := msg.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				return m, false, ErrNotFound
			}
			var nm meta
			if json.Unmarshal(msg.Data, &nm) != nil {
				continue
			}
			if nm.ID != id {
				return m, false, ErrNotFound
			}
			if nm.Deleted {
				return m, false, ErrGone
			}
			return nm, true, nil
		}
	}
}

func (h *Handler) read(w http.ResponseWriter, r *http.Request, principal, name string) {
	ctx := r.Context()
	k := key(principal, name)
	query := r.URL.Query()
	offsets, hasOffset := query["offset"]
	live := query.Get("live")
	var offset string
	if hasOffset {
		if len(offsets) != 1 || offsets[0] == "" {
			h.fail(w, badRequest("one non-empty offset"))
			return
		}
		offset = offsets[0]
		if _, ok := parseOffset(offset); !ok && offset != "-1" && offset != "now" {
			h.fail(w, badRequest("invalid offset"))
			return
		}
	}
	m, err := h.loadLive(ctx, k, true)
	if err != nil {
		h.fail(w, err)
		return
	}
	if (live == "long-poll" || live == "sse") && !hasOffset {
		h.fail(w, badRequest("live reads need an offset"))
		return
	}
	after, _ := parseOffset(offset)
	if offset == "now" {
		after = m.Tail
	}
	jsonMode := isJSON(m.ContentType)
	hd := w.Header()
	if live == "sse" {
		h.sse(w, r, k, m, after)
		return
	}
	if offset == "now" && live != "long-poll" {
		hd.Set(hOffset, formatOffset(m.Tail))
		hd.Set(hUpToDate, "true")
		hd.Set("Cache-Control", "no-store")
		hd.Set("Content-Type", m.ContentType)
		if m.Closed {
			hd.Set(hClosed, "true")
		}
		if jsonMode {
			io.WriteString(w, "[]")
		}
		return
	}
	recs, more, err := h.st.read(ctx, m, after, 0, h.cfg.MaxReadBytes)
	if err != nil {
		h.fail(w, err)
		return
	}
	if live == "long-poll" && len(recs) == 0 && !more {
		wt, err := h.watch(k)
		if err != nil {
			h.fail(w, err)
			return
		}
		defer wt.stop()
		// Data stored before the subscription is read now; later data wakes wt.
		if m, err = h.loadLive(ctx, k, false); err == nil {
			recs, more, err = h.st.read(ctx, m, after, 0, h.cfg.MaxReadBytes)
		}
		if err != nil {
			h.fail(w, err)
			return
		}
		deadline := time.Now().Add(h.cfg.LongPollTimeout)
		for len(recs) == 0 && !m.Closed {
			nm, ok, err := wt.wait(ctx, h.done, m.ID, time.Until(deadline))
			if err != nil {
				h.fail(w, err)
				return
			}
			if !ok {
				break
			}
			m = nm
			if recs, more, err = h.st.read(ctx, m, after, 0, h.cfg.MaxReadBytes); err != nil {
				h.fail(w, err)
				return
			}
		}
		if len(recs) == 0 {
			hd.Set(hOffset, formatOffset(max(after, m.Tail)))
			hd.Set(hUpToDate, "true")
			hd.Set(hCursor, cursor(query.Get("cursor"), time.Now()))
			if m.Closed {
				hd.Set(hClosed, "true")
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	end := m.Tail
	if len(recs) > 0 {
		end = recs[len(recs)-1].Seq
	}
	hd.Set("Content-Type", m.ContentType)
	hd.Set(hOffset, formatOffset(end))
	if live == "long-poll" {
		hd.Set(hCursor, cursor(query.Get("cursor"), time.Now()))
	}
	if !more {
		hd.Set(hUpToDate, "true")
	}
	closed := m.Closed && !more && end >= m.Tail
	if closed {
		hd.Set(hClosed, "true")
	}
	start := offset
	if start == "" {
		start = "-1"
	}
	tag := etag(r.URL.Path, start, formatOffset(end), closed)
	hd.Set("ETag", tag)
	if inm := r.Header.Get("If-None-Match"); inm != "" && inm == tag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	var body bytes.Buffer
	if jsonMode {
		body.WriteByte('[')
	}
	for i, rec := range recs {
		if jsonMode && i > 0 {
			body.WriteByte(',')
		}
		body.Write(rec.Data)
	}
	if jsonMode {
		body.WriteByte(']')
	}
	hd.Set("Content-Length", strconv.Itoa(body.Len()))
	w.WriteHeader(http.StatusOK)
	w.Write(body.Bytes())
}

// sseBatch is how many records one SSE read fetches (at most Config.MaxReadBytes of them).
const sseBatch = 1024

// sse serves live=sse: a data event per record, each followed by a control event, then
// control events as the stream grows, until it closes or the client goes.
func (h *Handler) sse(w http.ResponseWriter, r *http.Request, k string, m meta, after uint64) {
	ctx := r.Context()
	wt, err := h.watch(k)
	if err != nil {
		h.fail(w, err)
		return
	}
	defer wt.stop()
	base64Mode := !isJSON(m.ContentType) && !strings.HasPrefix(mediaType(m.ContentType), "text/")
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	if base64Mode {
		hd.Set(hSSEEncoding, "base64")
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Time{})
	clientCursor := r.URL.Query().Get("cursor")
	var buf bytes.Buffer
	control := func(off uint64, upToDate, closed bool) {
		buf.WriteString("event: control\n")
		var b []byte
		if closed {
			b, _ = json.Marshal(struct {
				Offset string `json:"streamNextOffset"`
				Closed bool   `json:"streamClosed"`
			}{formatOffset(off), true})
		} else {
			b, _ = json.Marshal(struct {
				Offset   string `json:"streamNextOffset"`
				Cursor   string `json:"streamCursor"`
				UpToDate bool   `json:"upToDate,omitempty"`
			}{formatOffset(off), cursor(clientCursor, time.Now()), upToDate})
		}
		writeSSEData(&buf, b)
	}
	flush := func() bool {
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false
		}
		buf.Reset()
		return rc.Flush() == nil
	}
	fresh := true // m was just loaded
	for {
		if !fresh {
			var err error
			if m, err = h.loadLive(ctx, k, true); err != nil {
				return
			}
		}
		fresh = false
		recs, more, err := h.st.read(ctx, m, after, sseBatch, h.cfg.MaxReadBytes)
		if err != nil {
			if ctx.Err() == nil {
				h.cfg.Logger.Warn("durable streams: SSE read failed", "err", err)
			}
			return
		}
		for i, rec := range recs {
			buf.WriteString("event: data\n")
			switch {
			case base64Mode:
				writeSSEData(&buf, []byte(base64.StdEncoding.EncodeToString(rec.Data)))
			case isJSON(m.ContentType):
				writeSSEData(&buf, append(append([]byte{'['}, rec.Data...), ']'))
			default:
				writeSSEData(&buf, rec.Data)
			}
			after = rec.Seq
			last := i == len(recs)-1 && !more
			control(after, last, last && m.Closed && after >= m.Tail)
			if buf.Len() > 64<<10 && !flush() {
				return
			}
		}
		if len(recs) == 0 {
			after = max(after, m.Tail)
			control(after, true, m.Closed)
		}
		if !flush() {
			return
		}
		if m.Closed && !more && after >= m.Tail {
			return
		}
		if more {
			continue
		}
		_, ok, err := wt.wait(ctx, h.done, m.ID, h.cfg.LongPollTimeout)
		if err != nil {
			return
		}
		select {
		case <-h.done: // shutting down: the client resumes elsewhere from its last offset
			return
		default:
		}
		if !ok { // keep-alive
			control(after, true, false)
			if !flush() {
				return
			}
		}
	}
}

// writeSSEData writes payload as data: lines, one per line of payload (CR, LF and CRLF all
// end a line, so a payload cannot inject events), and the blank line ending the event.
func writeSSEData(buf *bytes.Buffer, payload []byte) {
	for {
		i := bytes.IndexAny(payload, "\r\n")
		buf.WriteString("data:")
		if i < 0 {
			buf.Write(payload)
			buf.WriteByte('\n')
			break
		}
		buf.Write(payload[:i])
		buf.WriteByte('\n')
		if payload[i] == '\r' && i+1 < len(payload) && payload[i+1] == '\n' {
			i++
		}
		payload = payload[i+1:]
	}
	buf.WriteByte('\n')
}
