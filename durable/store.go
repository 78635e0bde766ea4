package durable

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
)

// Errors of the store, each answered with one HTTP status by the handler.
var (
	ErrNotFound      = errors.New("durable: stream not found")                       // 404
	ErrGone          = errors.New("durable: stream deleted, forks still read it")    // 410
	ErrExists        = errors.New("durable: stream exists with another config")      // 409
	ErrForksBlock    = errors.New("durable: deleted stream still has forks")         // 409
	ErrContentType   = errors.New("durable: content type mismatch")                  // 409
	ErrSeqConflict   = errors.New("durable: Stream-Seq not above the last one")      // 409
	ErrStreamClosed  = errors.New("durable: stream closed")                          // 409
	ErrForkOffset    = errors.New("durable: fork offset beyond the source's tail")   // 400
	ErrForkSubOffset = errors.New("durable: fork sub-offset beyond its message")     // 400
	ErrBusy          = errors.New("durable: too many concurrent changes, try again") // 503

	errReplaced = errors.New("durable: stream deleted and created again")
)

// Message headers (doc.go).
const (
	hdrProducer = "Ds-P"
	hdrEpoch    = "Ds-E"
	hdrPSeq     = "Ds-Q"
	hdrSeq      = "Ds-S"
	hdrClose    = "Ds-C"
)

// maxAttempts bounds the compare-and-set retries of one operation.
const maxAttempts = 50

// producerState is an idempotent producer's last accepted epoch and seq, and the offset
// after that append.
type producerState struct {
	Epoch uint64 `json:"e"`
	Seq   uint64 `json:"s"`
	Off   uint64 `json:"o"`
}

// producerTuple identifies one append of an idempotent producer.
type producerTuple struct {
	ID    string `json:"id"`
	Epoch uint64 `json:"e"`
	Seq   uint64 `json:"s"`
}

// forkRef names a fork's source incarnation and where the fork starts.
type forkRef struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Name   string `json:"name"`
	Offset uint64 `json:"off"`
	Sub    int    `json:"sub,omitempty"`
}

// meta is one incarnation's metadata (doc.go).
type meta struct {
	ID          string                   `json:"id"`
	ContentType string                   `json:"ct"`
	HasTTL      bool                     `json:"hasTTL,omitempty"`
	TTL         int64                    `json:"ttl,omitempty"` // seconds
	ExpiresAt   string                   `json:"exp,omitempty"` // as the client wrote it
	Expires     int64                    `json:"expMs,omitempty"`
	Access      int64                    `json:"acc"` // Unix ms of the last read or write
	Closed      bool                     `json:"closed,omitempty"`
	ClosedBy    *producerTuple           `json:"closedBy,omitempty"`
	Last        uint64                   `json:"last,omitempty"` // the subject's last sequence
	Tail        uint64                   `json:"tail,omitempty"` // the last data's sequence
	Seq         string                   `json:"seq,omitempty"`
	Producers   map[string]producerState `json:"prod,omitempty"`
	Fork        *forkRef                 `json:"fork,omitempty"`
	Refs        int                      `json:"refs,omitempty"`
	Deleted     bool                     `json:"deleted,omitempty"`
}

// expired reports whether m's TTL or expiry has passed at now (Unix ms).
func (m *meta) expired(now int64) bool {
	return (m.Expires != 0 && now >= m.Expires) || (m.HasTTL && now >= m.Access+m.TTL*1000)
}

// apply records in m the effects of the message of sequence seq. It is a no-op for a
// message m already holds.
func (m *meta) apply(seq uint64, hdr nats.Header, bodyLen int, now int64) {
	if seq <= m.Last {
		return
	}
	m.Last = seq
	if bodyLen > 0 {
		m.Tail = seq
	}
	p := hdr.Get(hdrProducer)
	epoch, _ := strconv.ParseUint(hdr.Get(hdrEpoch), 10, 64)
	pseq, _ := strconv.ParseUint(hdr.Get(hdrPSeq), 10, 64)
	if p != "" {
		if m.Producers == nil {
			m.Producers = map[string]producerState{}
		}
		m.Producers[p] = producerState{Epoch: epoch, Seq: pseq, Off: m.Tail}
	}
	if s := hdr.Get(hdrSeq); s != "" {
		m.Seq = s
	}
	if hdr.Get(hdrClose) != "" {
		m.Closed = true
		if p != "" {
			m.ClosedBy = &producerTuple{ID: p, Epoch: epoch, Seq: pseq}
		}
	}
	m.Access = now
}

// store is the NATS side of the handler.
type store struct {
	cfg    Config
	nc     *nats.Conn
	js     natsjs.JetStream
	stream natsjs.Stream
	kv     natsjs.KeyValue
	now    func() time.Time

	mu    sync.Mutex
	locks map[string]*keyLock   // appends in progress in this process, by key
	cache map[string]cachedMeta // metadata appends of this process wrote, by key
}

// keyLock serializes one process's appends to a stream: concurrent ones would only refuse
// each other at the fence and retry. Appends from other processes are still fenced.
type keyLock struct {
	sem   chan struct{}
	users int
}

// lock takes key's append lock; the caller calls the returned function to release it.
func (s *store) lock(ctx context.Context, key string) (func(), error) {
	s.mu.Lock()
	l := s.locks[key]
	if l == nil {
		l = &keyLock{sem: make(chan struct{}, 1)}
		s.locks[key] = l
	}
	l.users++
	s.mu.Unlock()
	drop := func() {
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, key)
		}
		s.mu.Unlock()
	}
	select {
	case l.sem <- struct{}{}:
		return func() { <-l.sem; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

func newStore(ctx context.Context, cfg Config) (*store, error) {
	s := &store{cfg: cfg, nc: cfg.Conn, js: cfg.JetStream, now: time.Now, locks: map[string]*keyLock{},
		cache: map[string]cachedMeta{}}
	var err error
	s.stream, err = s.js.CreateOrUpdateStream(ctx, natsjs.StreamConfig{
		Name:      cfg.Stream,
		Subjects:  []string{cfg.Subject + ".>"},
		Storage:   natsjs.FileStorage,
		Retention: natsjs.LimitsPolicy,
		Discard:   natsjs.DiscardOld,
		MaxAge:    cfg.Retention,
		Replicas:  cfg.Replicas,
		// Readers use batched direct gets (one request for many messages).
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("durable: stream %s: %w", cfg.Stream, err)
	}
	s.kv, err = s.js.CreateOrUpdateKeyValue(ctx, bucket.Config(cfg.Bucket, cfg.Retention, cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("durable: bucket %s: %w", cfg.Bucket, err)
	}
	return s, nil
}

// key is the bucket key of a principal's stream name.
func key(principal, name string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%s", len(principal), principal, name)
	return "s" + hex.EncodeToString(h.Sum(nil)[:20])
}

func (s *store) subject(id string) string { return s.cfg.Subject + "." + id }

// kvSubject is the subject of the bucket's updates of key: long-poll and SSE wake on it.
func (s *store) kvSubject(key string) string { return "$KV." + s.cfg.Bucket + "." + key }

func (s *store) nowMs() int64 { return s.now().UnixMilli() }

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// get returns key's metadata and revision as stored, expired or not. It reads from the
// bucket's leader: a replica's direct get could answer with a revision it has not caught up
// on, and a stale producer state would refuse a producer's next seq as a gap.
func (s *store) get(ctx context.Context, key string) (meta, uint64, error) {
	msg, err := s.lastMsg(ctx, "KV_"+s.cfg.Bucket, s.kvSubject(key))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return meta{}, 0, ErrNotFound
	}
	if err != nil {
		return meta{}, 0, err
	}
	if op := msg.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return meta{}, 0, ErrNotFound
	}
	var m meta
	if err := json.Unmarshal(msg.Data, &m); err != nil {
		return meta{}, 0, fmt.Errorf("durable: metadata of %s: %w", key, err)
	}
	return m, msg.Sequence, nil
}

// lastMsg returns the last message of subject in stream, read from the stream's leader.
func (s *store) lastMsg(ctx context.Context, stream, subject string) (*natsjs.RawStreamMsg, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	// A request made while the stream has no leader may never be answered: bound it, also
	// under a context without deadline (commit's).
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	resp, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Message *struct {
			Seq    uint64 `json:"seq"`
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *natsjs.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("durable: get %s: %w", subject, err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == natsjs.JSErrCodeMessageNotFound {
			return nil, natsjs.ErrMsgNotFound
		}
		return nil, r.Error
	}
	if r.Message == nil {
		return nil, fmt.Errorf("durable: get %s: empty answer", subject)
	}
	out := &natsjs.RawStreamMsg{Sequence: r.Message.Seq, Data: r.Message.Data, Header: nats.Header{}}
	if len(r.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("durable: get %s: %w", subject, err)
		}
	}
	return out, nil
}

// put stores m under key by compare-and-set on rev; it returns false on a conflict.
func (s *store) put(ctx context.Context, key string, m meta, rev uint64) (bool, error) {
	_, ok, err := s.putRev(ctx, key, m, rev)
	return ok, err
}

// putRev is put, also returning the new revision.
func (s *store) putRev(ctx context.Context, key string, m meta, rev uint64) (uint64, bool, error) {
	s.forget(key)
	b, _ := json.Marshal(m)
	nrev, err := s.kv.Update(ctx, key, b, rev)
	if isConflict(err) {
		return 0, false, nil
	}
	return nrev, err == nil, err
}

// maxCached bounds the cache of metadata an append wrote.
const maxCached = 4096

// cachedMeta is metadata this process wrote last, with its revision.
type cachedMeta struct {
	m   meta
	rev uint64
}

// remember caches the metadata an append wrote: the next append to the stream through this
// process validates against it without reading it back. It is only a guess: a publish
// expects its Last, the update its revision, and an append it would not accept is decided
// again on metadata read from the bucket.
func (s *store) remember(key string, m meta, rev uint64) {
	s.mu.Lock()
	if len(s.cache) >= maxCached {
		clear(s.cache)
	}
	s.cache[key] = cachedMeta{m, rev}
	s.mu.Unlock()
}

func (s *store) forget(key string) {
	s.mu.Lock()
	delete(s.cache, key)
	s.mu.Unlock()
}

func (s *store) cached(key string) (cachedMeta, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cache[key]
	return c, ok
}

func isConflict(err error) bool {
	var apiErr *natsjs.APIError
	return errors.Is(err, natsjs.ErrKeyExists) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant))
}

// load returns key's live metadata: an expired stream is deleted (or soft-deleted) first.
// A soft-deleted stream is returned with Deleted set.
func (s *store) load(ctx context.Context, key string) (meta, uint64, error) {
	for range maxAttempts {
		m, rev, err := s.get(ctx, key)
		if err != nil {
			return m, rev, err
		}
		if m.Deleted || !m.expired(s.nowMs()) {
			return m, rev, nil
		}
		if err := s.expire(ctx, key, m, rev); err != nil {
			return m, rev, err
		}
	}
	return meta{}, 0, ErrBusy
}

// expire deletes an expired or deleted stream, or soft-deletes it while forks reference it.
// A conflict returns nil: the caller reloads.
func (s *store) expire(ctx context.Context, key string, m meta, rev uint64) error {
	if m.Refs > 0 {
		m.Deleted = true
		_, err := s.put(ctx, key, m, rev)
		return err
	}
	return s.remove(ctx, key, m, rev)
}

// remove deletes key's incarnation m: its metadata, its messages, and its reference on its
// fork source, which goes too when it was soft-deleted and this was its last fork.
func (s *store) remove(ctx context.Context, key string, m meta, rev uint64) error {
	s.forget(key)
	err := s.kv.Delete(ctx, key, natsjs.LastRevision(rev))
	if isConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.stream.Purge(ctx, natsjs.WithPurgeSubject(s.subject(m.ID))); err != nil {
		s.cfg.Logger.Warn("durable: purge a deleted stream", "err", err)
	}
	if m.Fork != nil {
		return s.release(ctx, m.Fork.Key, m.Fork.ID)
	}
	return nil
}

// release drops one fork reference of the source incarnation id at key.
func (s *store) release(ctx context.Context, key, id string) error {
	for range maxAttempts {
		m, rev, err := s.get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.ID != id {
			return nil
		}
		m.Refs--
		if m.Refs <= 0 && m.Deleted {
			m.Refs = 0
			s.forget(key)
			if err := s.kv.Delete(ctx, key, natsjs.LastRevision(rev)); isConflict(err) {
				continue
			} else if err != nil {
				return err
			}
			s.stream.Purge(ctx, natsjs.WithPurgeSubject(s.subject(m.ID)))
			if m.Fork != nil {
				return s.release(ctx, m.Fork.Key, m.Fork.ID)
			}
			return nil
		}
		if ok, err := s.put(ctx, key, m, rev); ok || err != nil {
			return err
		}
	}
	return ErrBusy
}

// touch renews a TTL stream's lease of life on a read, by compare-and-set; a conflict means
// someone else wrote it, which renewed it too.
func (s *store) touch(ctx context.Context, key string, m meta, rev uint64) {
	now := s.nowMs()
	if !m.HasTTL || now-m.Access < m.TTL*1000/10 {
		return
	}
	m.Access = now
	s.put(ctx, key, m, rev)
}

// delete deletes a stream, or soft-deletes it while forks reference it.
func (s *store) delete(ctx context.Context, key string) error {
	for range maxAttempts {
		m, rev, err := s.load(ctx, key)
		if err != nil {
			return err
		}
		if m.Deleted {
			return ErrGone
		}
		if m.Refs > 0 {
			m.Deleted = true
			if ok, err := s.put(ctx, key, m, rev); ok || err != nil {
				return err
			}
			continue
		}
		s.forget(key)
		err = s.kv.Delete(ctx, key, natsjs.LastRevision(rev))
		if isConflict(err) {
			continue
		}
		if err != nil {
			return err
		}
		s.stream.Purge(ctx, natsjs.WithPurgeSubject(s.subject(m.ID)))
		if m.Fork != nil {
			return s.release(ctx, m.Fork.Key, m.Fork.ID)
		}
		return nil
	}
	return ErrBusy
}

// createRequest is a PUT.
type createRequest struct {
	ContentType string // empty: a fork inherits its source's
	HasTTL      bool
	TTL         int64
	ExpiresAt   string
	Expires     int64
	Closed      bool
	Body        []byte // stored form (JSON: elements joined by commas)
	ForkFrom    string // source name; empty: not a fork
	ForkOffset  *uint64
	ForkSub     int
}

// create creates a stream, or returns the existing one (created false) when its config is
// the same.
func (s *store) create(ctx context.Context, principal, name string, r createRequest) (m meta, created bool, err error) {
	k := key(principal, name)
	for range maxAttempts {
		old, _, err := s.load(ctx, k)
		if err == nil {
			if old.Deleted {
				return old, false, ErrForksBlock
			}
			if !sameConfig(old, r) {
				return old, false, ErrExists
			}
			return old, false, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return m, false, err
		}
		m = meta{ID: newID(), ContentType: r.ContentType, HasTTL: r.HasTTL, TTL: r.TTL,
			ExpiresAt: r.ExpiresAt, Expires: r.Expires, Access: s.nowMs()}
		var prefix []byte
		if r.ForkFrom != "" {
			if prefix, err = s.fork(ctx, principal, &m, r); err != nil {
				return m, false, err
			}
		}
		subj := s.subject(m.ID)
		for _, body := range [][]byte{prefix, r.Body} {
			if len(body) == 0 {
				continue
			}
			msg := nats.NewMsg(subj)
			msg.Data = body
			ack, err := s.js.PublishMsg(ctx, msg, natsjs.WithExpectLastSequencePerSubject(m.Last))
			if err != nil {
				s.abandon(ctx, m)
				return m, false, err
			}
			m.Last, m.Tail = ack.Sequence, ack.Sequence
		}
		m.Closed = r.Closed
		b, _ := json.Marshal(m)
		s.forget(k)
		if _, err := s.kv.Create(ctx, k, b); err != nil {
			s.abandon(ctx, m)
			if isConflict(err) {
				continue // created meanwhile: compare with it
			}
			return m, false, err
		}
		return m, true, nil
	}
	return m, false, ErrBusy
}

// abandon undoes a create that did not store its metadata.
func (s *store) abandon(ctx context.Context, m meta) {
	ctx = context.WithoutCancel(ctx)
	if m.Last != 0 {
		s.stream.Purge(ctx, natsjs.WithPurgeSubject(s.subject(m.ID)))
	}
	if m.Fork != nil {
		s.release(ctx, m.Fork.Key, m.Fork.ID)
	}
}

// sameConfig reports whether a PUT asks for the stream m is (an idempotent create).
func sameConfig(m meta, r createRequest) bool {
	isFork := m.Fork != nil
	if (r.ForkFrom != "") != isFork {
		return false
	}
	if r.ContentType != "" || !isFork {
		ct := r.ContentType
		if ct == "" {
			ct = "application/octet-stream"
		}
		if mediaType(ct) != mediaType(m.ContentType) {
			return false
		}
	}
	if !isFork || r.HasTTL || r.ExpiresAt != "" {
		if r.HasTTL != m.HasTTL || r.TTL != m.TTL || r.ExpiresAt != m.ExpiresAt {
			return false
		}
	}
	if r.Closed != m.Closed {
		return false
	}
	if isFork {
		if r.ForkFrom != m.Fork.Name || r.ForkSub != m.Fork.Sub ||
			(r.ForkOffset != nil && *r.ForkOffset != m.Fork.Offset) {
			return false
		}
	}
	return true
}

// fork fills m's fork fields from the source r names, takes a reference on the source, and
// returns the prefix a sub-offset materializes.
func (s *store) fork(ctx context.Context, principal string, m *meta, r createRequest) ([]byte, error) {
	sk := key(principal, r.ForkFrom)
	for range maxAttempts {
		src, rev, err := s.load(ctx, sk)
		if err != nil {
			return nil, err
		}
		if src.Deleted {
			return nil, ErrForksBlock
		}
		if r.ContentType != "" && mediaType(r.ContentType) != mediaType(src.ContentType) {
			return nil, ErrContentType
		}
		m.ContentType = src.ContentType
		if r.ContentType != "" {
			m.ContentType = r.ContentType
		}
		off := src.Tail
		if r.ForkOffset != nil {
			off = *r.ForkOffset
		}
		if off > src.Tail {
			return nil, ErrForkOffset
		}
		var prefix []byte
		if r.ForkSub > 0 {
			recs, _, err := s.read(ctx, src, off, 1, 0)
			if err != nil {
				return nil, err
			}
			if len(recs) == 0 {
				return nil, ErrForkSubOffset
			}
			if prefix, err = subPrefix(recs[0].Data, r.ForkSub, isJSON(src.ContentType)); err != nil {
				return nil, err
			}
		}
		if !r.HasTTL && r.ExpiresAt == "" {
			m.HasTTL, m.TTL, m.ExpiresAt, m.Expires = src.HasTTL, src.TTL, src.ExpiresAt, src.Expires
		}
		m.Fork = &forkRef{Key: sk, ID: src.ID, Name: r.ForkFrom, Offset: off, Sub: r.ForkSub}
		m.Last, m.Tail = 0, off
		src.Refs++
		if ok, err := s.put(ctx, sk, src, rev); err != nil {
			return nil, err
		} else if ok {
			return prefix, nil
		}
	}
	return nil, ErrBusy
}

// subPrefix returns the first n bytes of data, or its first n JSON elements.
func subPrefix(data []byte, n int, jsonMode bool) ([]byte, error) {
	if !jsonMode {
		if n > len(data) {
			return nil, ErrForkSubOffset
		}
		return data[:n], nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(append(append([]byte{'['}, data...), ']'), &elems); err != nil || n > len(elems) {
		return nil, ErrForkSubOffset
	}
	parts := make([][]byte, n)
	for i := range parts {
		parts[i] = elems[i]
	}
	return bytes.Join(parts, []byte{','}), nil
}

// appendRequest is a POST.
type appendRequest struct {
	ContentType string
	Body        []byte // stored form; empty with Close: a close-only request
	Close       bool
	Seq         string
	Producer    *producerTuple
}

// appendStatus is how an append was answered.
type appendStatus int

const (
	appendInvalid    appendStatus = iota
	appendAccepted                // stored (or, for a plain close-only, closed already)
	appendDuplicate               // an idempotent producer's retry: not stored again
	appendStaleEpoch              // 403
	appendEpochSeq                // 400: a new epoch must start at seq 0
	appendSeqGap                  // 409
)

// appendResult answers an append.
type appendResult struct {
	Status   appendStatus
	Offset   uint64 // the tail after the append (or the duplicate's)
	Closed   bool
	Epoch    uint64 // the producer's current epoch (stale epoch)
	Seq      uint64 // the producer's highest accepted seq (duplicate)
	Expected uint64 // the seq expected (gap)
}

// append appends one message (or closes) under the rules of doc.go.
func (s *store) append(ctx context.Context, principal, name string, r appendRequest) (appendResult, error) {
	k := key(principal, name)
	unlock, err := s.lock(ctx, k)
	if err != nil {
		return appendResult{}, err
	}
	defer unlock()
	for range maxAttempts {
		c, fromCache := s.cached(k)
		m, rev := c.m, c.rev
		if !fromCache || m.expired(s.nowMs()) {
			fromCache = false
			var err error
			if m, rev, err = s.load(ctx, k); err != nil {
				return appendResult{}, err
			}
		}
		if m.Deleted {
			return appendResult{}, ErrGone
		}
		res, err := decide(m, r)
		if err != nil || res.Status != appendAccepted || (m.Closed && r.Producer == nil) {
			if fromCache { // answer from the bucket's metadata, not a guess
				s.forget(k)
				continue
			}
			if errors.Is(err, ErrStreamClosed) {
				res.Offset = m.Tail
			}
			return res, err
		}
		msg := nats.NewMsg(s.subject(m.ID))
		msg.Data = r.Body
		if p := r.Producer; p != nil {
			msg.Header.Set(hdrProducer, p.ID)
			msg.Header.Set(hdrEpoch, strconv.FormatUint(p.Epoch, 10))
			msg.Header.Set(hdrPSeq, strconv.FormatUint(p.Seq, 10))
		}
		if r.Seq != "" {
			msg.Header.Set(hdrSeq, r.Seq)
		}
		if r.Close {
			msg.Header.Set(hdrClose, "1")
		}
		ack, err := s.js.PublishMsg(ctx, msg, natsjs.WithExpectLastSequencePerSubject(m.Last))
		if isConflict(err) {
			s.forget(k)
			if err := s.rollForward(ctx, k, m.ID); err != nil {
				return appendResult{}, err
			}
			continue
		}
		if err != nil {
			s.forget(k)
			return appendResult{}, fmt.Errorf("durable: append: %w", err)
		}
		// Most often nobody wrote the metadata meanwhile: record the message on the revision
		// read; else commit reads it again.
		next := m
		next.Producers = maps.Clone(m.Producers)
		next.apply(ack.Sequence, msg.Header, len(r.Body), s.nowMs())
		if nrev, ok, _ := s.putRev(ctx, k, next, rev); ok {
			s.remember(k, next, nrev)
		} else if _, err := s.commit(ctx, k, m.ID, ack.Sequence, msg.Header, len(r.Body)); errors.Is(err, errReplaced) || errors.Is(err, ErrNotFound) {
			// Deleted (and maybe created again) since m was read: the message went to the
			// old incarnation's subject. Drop it and append to the new one, if any.
			s.stream.Purge(context.WithoutCancel(ctx), natsjs.WithPurgeSubject(s.subject(m.ID)))
			continue
		} else if err != nil {
			return appendResult{}, err
		}
		// The publish expected m.Last: nothing came between m and this message.
		res.Offset, res.Closed = m.Tail, r.Close
		if len(r.Body) > 0 {
			res.Offset = ack.Sequence
		}
		return res, nil
	}
	return appendResult{}, ErrBusy
}

// decide validates an append against m: an error, a final answer, or appendAccepted for a
// message to publish.
func decide(m meta, r appendRequest) (appendResult, error) {
	p := r.Producer
	var st producerState
	known := false
	if p != nil {
		st, known = m.Producers[p.ID]
	}
	if m.Closed {
		if p != nil {
			if c := m.ClosedBy; c != nil && *c == *p {
				return appendResult{Status: appendDuplicate, Offset: m.Tail, Closed: true, Seq: p.Seq}, nil
			}
			if known && p.Epoch < st.Epoch {
				return appendResult{Status: appendStaleEpoch, Epoch: st.Epoch}, nil
			}
			return appendResult{}, ErrStreamClosed
		}
		if len(r.Body) == 0 && r.Close {
			return appendResult{Status: appendAccepted, Offset: m.Tail, Closed: true}, nil
		}
		return appendResult{}, ErrStreamClosed
	}
	if len(r.Body) > 0 && mediaType(r.ContentType) != mediaType(m.ContentType) {
		return appendResult{}, ErrContentType
	}
	if p != nil {
		switch {
		case !known && p.Seq != 0:
			return appendResult{Status: appendSeqGap, Expected: 0}, nil
		case !known:
		case p.Epoch < st.Epoch:
			return appendResult{Status: appendStaleEpoch, Epoch: st.Epoch}, nil
		case p.Epoch > st.Epoch:
			if p.Seq != 0 {
				return appendResult{Status: appendEpochSeq}, nil
			}
		case p.Seq <= st.Seq:
			return appendResult{Status: appendDuplicate, Offset: st.Off, Seq: st.Seq}, nil
		case p.Seq != st.Seq+1:
			return appendResult{Status: appendSeqGap, Expected: st.Seq + 1}, nil
		}
	}
	if r.Seq != "" && m.Seq != "" && r.Seq <= m.Seq {
		return appendResult{}, ErrSeqConflict
	}
	return appendResult{Status: appendAccepted}, nil
}

// commit records the message of sequence seq in key's metadata (incarnation id) by
// compare-and-set, and returns the metadata that holds it.
func (s *store) commit(ctx context.Context, key, id string, seq uint64, hdr nats.Header, bodyLen int) (meta, error) {
	ctx = context.WithoutCancel(ctx) // the message is stored: record it
	for range maxAttempts {
		m, rev, err := s.get(ctx, key)
		if err != nil {
			return m, err
		}
		if m.ID != id {
			return m, errReplaced
		}
		if m.Last >= seq {
			return m, nil
		}
		m.apply(seq, hdr, bodyLen, s.nowMs())
		if ok, err := s.put(ctx, key, m, rev); err != nil {
			return m, err
		} else if ok {
			return m, nil
		}
	}
	return meta{}, ErrBusy
}

// rollForward records in key's metadata the subject's last message, stored by an appender
// that has not recorded it (yet, or ever).
func (s *store) rollForward(ctx context.Context, key, id string) error {
	raw, err := s.lastMsg(ctx, s.cfg.Stream, s.subject(id))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err = s.commit(ctx, key, id, raw.Sequence, raw.Header, len(raw.Data)); errors.Is(err, errReplaced) {
		return nil // the caller reads the new incarnation
	}
	return err
}

// record is one stored append.
type record struct {
	Seq  uint64
	Data []byte
}

// segment is a subject to read, up to a sequence (0: its end).
type segment struct {
	subject string
	upTo    uint64
}

// segments lists what m's log is made of: its sources' prefixes, then its own subject.
func (s *store) segments(ctx context.Context, m meta, upTo uint64) ([]segment, error) {
	var segs []segment
	if f := m.Fork; f != nil {
		src, _, err := s.get(ctx, f.Key)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err == nil && src.ID == f.ID {
			c := f.Offset
			if upTo != 0 && upTo < c {
				c = upTo
			}
			if c > 0 {
				if segs, err = s.segments(ctx, src, c); err != nil {
					return nil, err
				}
			}
		}
	}
	return append(segs, segment{s.subject(m.ID), upTo}), nil
}

// read returns up to max records (0: no limit) after sequence after, and about maxBytes
// of them (0: no limit, at least one record); more reports that the log holds more now.
func (s *store) read(ctx context.Context, m meta, after uint64, max, maxBytes int) (recs []record, more bool, err error) {
	segs, err := s.segments(ctx, m, 0)
	if err != nil {
		return nil, false, err
	}
	size := 0
	for i, sg := range segs {
		from := after + 1
		stale := 0
		for sg.upTo == 0 || from <= sg.upTo {
			n := 256
			if max > 0 && max-len(recs) < n {
				n = max - len(recs)
				if n == 0 {
					return recs, true, nil
				}
			}
			budget := 1 << 20
			if maxBytes > 0 {
				budget = max2(maxBytes-size, 1)
			}
			msgs, pending, err := s.batch(ctx, sg.subject, from, sg.upTo, n, budget)
			if err != nil {
				return nil, false, err
			}
			for _, msg := range msgs {
				seq, _ := strconv.ParseUint(msg.Header.Get(natsjs.SequenceHeader), 10, 64)
				if sg.upTo != 0 && seq > sg.upTo {
					pending = 0 // past the fork point: the rest is not inherited
					break
				}
				from = seq + 1
				if len(msg.Data) == 0 {
					continue // a close record
				}
				if (maxBytes > 0 && size > 0 && size+len(msg.Data) > maxBytes) || (max > 0 && len(recs) == max) {
					return recs, true, nil
				}
				recs = append(recs, record{Seq: seq, Data: msg.Data})
				size += len(msg.Data)
			}
			if len(msgs) == 0 || pending == 0 {
				// With replicas, a direct get may be answered by a replica that has not
				// applied the last messages the metadata records yet: wait for it.
				if i == len(segs)-1 && from <= m.Last && stale < staleRetries {
					stale++
					if err := sleep(ctx, staleWait); err != nil {
						return nil, false, err
					}
					continue
				}
				break
			}
		}
	}
	return recs, false, nil
}

func max2(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// A read retries a direct get answered by a lagging replica staleRetries times, staleWait
// apart.
const (
	staleRetries = 40
	staleWait    = 5 * time.Millisecond
)

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// apiTimeout bounds one JetStream API request of the store's own.
const apiTimeout = 5 * time.Second

// batchTimeout bounds one batched direct get.
const batchTimeout = 10 * time.Second

// batch reads up to n messages of subject from sequence from (up to upTo, 0: the end) with
// one batched direct get. pending is how many more the subject holds after them.
func (s *store) batch(ctx context.Context, subject string, from, upTo uint64, n, maxBytes int) (msgs []*nats.Msg, pending uint64, err error) {
	req, _ := json.Marshal(struct {
		Seq      uint64 `json:"seq"`
		NextFor  string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes,omitempty"`
		UpToSeq  uint64 `json:"up_to_seq,omitempty"`
	}{from, subject, n, maxBytes, upTo})
	inbox := s.nc.NewRespInbox()
	ch := make(chan *nats.Msg, n+2)
	sub, err := s.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, 0, err
	}
	defer sub.Unsubscribe()
	if err := s.nc.PublishRequest("$JS.API.DIRECT.GET."+s.cfg.Stream, inbox, req); err != nil {
		return nil, 0, err
	}
	timer := time.NewTimer(batchTimeout)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-timer.C:
			return nil, 0, errors.New("durable: read timed out")
		case msg := <-ch:
			switch status := msg.Header.Get("Status"); status {
			case "":
				msgs = append(msgs, msg)
				pending, _ = strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
			case "204": // end of batch
				pending, _ = strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
				return msgs, pending, nil
			case "404":
				return msgs, 0, nil
			default:
				return nil, 0, fmt.Errorf("durable: read: status %s %s", status, msg.Header.Get("Description"))
			}
		}
	}
}

// mediaType is a content type's media type, lower-case, without parameters.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}

// isJSON reports whether a stream of content type ct is in JSON mode.
func isJSON(ct string) bool { return mediaType(ct) == "application/json" }
