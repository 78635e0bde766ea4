package threadstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
)

// A thread's value carries what a list of threads shows of it in a header (hdrThreadHead):
// a list reads the headers of the principal's values only, never a transcript.

// hdrThreadHead is the header of a thread's value that holds its headSummary.
const hdrThreadHead = "Wsg-Thread-Head"

// headSummary is what a thread list shows of a thread, and whose it is.
type headSummary struct {
	Principal string `json:"principal"`
	ThreadSummary
}

// summary returns what a thread list shows of t.
func (t *ThreadHead) summary() headSummary {
	return headSummary{Principal: t.Principal, ThreadSummary: ThreadSummary{ThreadID: t.ThreadID, Title: t.Title,
		Created: t.Created, Updated: t.Updated, ActiveRun: t.ActiveRun()}}
}

// headSubject returns the subject of the thread bucket's key.
func (s *Store) headSubject(key string) string { return "$KV." + s.cfg.Bucket + "." + key }

// putHead writes value under the thread key, with t's summary in its header, conditionally
// on revision rev (0: the key holds no value, or a delete marker), as the bucket's Update and
// Create do, and with their retries (electedKV).
func (s *Store) putHead(ctx context.Context, key string, value []byte, t *Thread, rev uint64) (uint64, error) {
	sum, err := json.Marshal(t.summary())
	if err != nil {
		return 0, err
	}
	subject := s.headSubject(key)
	s.threadBytes.Add(int64(len(value) + len(sum) + len(subject)))
	publish := func(ctx context.Context, rev uint64) (uint64, error) {
		m := nats.NewMsg(subject)
		m.Data = value
		m.Header.Set(hdrThreadHead, string(sum))
		ack, err := s.js.PublishMsg(ctx, m, natsjs.WithExpectLastSequencePerSubject(rev))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	}
	return s.threads.Retry(ctx, func(ctx context.Context) (uint64, error) {
		seq, err := publish(ctx, rev)
		if err == nil || rev != 0 || !bucket.IsWrongLastSeq(err) {
			return seq, err
		}
		// Created over a delete or purge marker: write after the marker.
		last, gerr := s.threadStream.GetLastMsgForSubject(ctx, subject)
		if gerr != nil {
			return 0, err
		}
		if op := last.Header.Get("KV-Operation"); op != "DEL" && op != "PURGE" {
			return 0, natsjs.ErrKeyExists
		}
		return publish(ctx, last.Sequence)
	}, s.threads.Holds(key, value))
}

// ThreadBytesWritten returns the bytes of the thread writes this store made since it opened:
// the heads' values and headers, records and segments (keys included), counted once each (a
// write retried after a conflict counts again).
func (s *Store) ThreadBytesWritten() int64 { return s.threadBytes.Load() }

// threadsRead lists the principal's threads from their values' headers, and returns the
// bytes it read. A value written before heads had headers is read whole (and gets its
// header at its next update).
func (s *Store) threadsRead(ctx context.Context, principal string) ([]ThreadSummary, int, error) {
	prefix := "$KV." + s.cfg.Bucket + "." + principalPrefix(principal) + "."
	c, err := s.threadStream.OrderedConsumer(ctx, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + "*"},
		DeliverPolicy:  natsjs.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
		// The server forgets it soon after the list (by default, after 5 minutes).
		InactiveThreshold: threadListWait + 5*time.Second,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("threads: %w", err)
	}
	var list []ThreadSummary
	read := 0
	pending := c.CachedInfo().NumPending
	for pending > 0 {
		batch, err := c.Fetch(int(min(pending, 256)), natsjs.FetchMaxWait(threadListWait))
		if err != nil {
			return nil, 0, fmt.Errorf("threads: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, fmt.Errorf("threads: %w", err)
			}
			pending = md.NumPending
			for k, v := range m.Headers() {
				read += len(k) + 4
				for _, x := range v {
					read += len(x)
				}
			}
			if op := m.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				continue
			}
			var h headSummary
			if v := m.Headers().Get(hdrThreadHead); v != "" {
				if json.Unmarshal([]byte(v), &h) != nil {
					continue
				}
			} else {
				// A value of a gateway before headers: read it.
				e, err := s.threads.Get(ctx, strings.TrimPrefix(m.Subject(), "$KV."+s.cfg.Bucket+"."))
				if errors.Is(err, natsjs.ErrKeyNotFound) {
					continue
				}
				if err != nil {
					return nil, 0, fmt.Errorf("threads: %w", err)
				}
				read += len(e.Value())
				var t ThreadHead
				if json.Unmarshal(e.Value(), &t) != nil {
					continue
				}
				h = t.summary()
			}
			if h.Principal != principal {
				continue
			}
			list = append(list, h.ThreadSummary)
		}
		if err := batch.Error(); err != nil {
			return nil, 0, fmt.Errorf("threads: %w", err)
		}
		if n == 0 {
			return nil, 0, errors.New("threads: the bucket did not deliver the heads in time")
		}
	}
	slices.SortFunc(list, func(a, b ThreadSummary) int {
		if c := b.Updated.Compare(a.Updated); c != 0 {
			return c
		}
		return strings.Compare(a.ThreadID, b.ThreadID)
	})
	return list, read, nil
}

// countThreads returns how many threads the principal has: the subjects of its heads, which
// the bucket's stream counts in one request (a deleted thread's subject is purged whole,
// DeleteThread; an expired head's message is gone). Its answer names every subject counted.
func (s *Store) countThreads(ctx context.Context, principal string) (int, error) {
	info, err := s.threadStream.Info(ctx, natsjs.WithSubjectFilter("$KV."+s.cfg.Bucket+"."+principalPrefix(principal)+".*"))
	if err != nil {
		return 0, fmt.Errorf("threads: %w", err)
	}
	return len(info.State.Subjects), nil
}

// threadCounts keeps the principals' thread counts as this store last learnt them
// (countThreads), for countFresh, with the threads it created and deleted since: a run that
// would start a thread costs that request once per principal and countFresh, however many
// start at once (a count's answer grows with the principal's threads). Another gateway's
// creations are seen at the next count: the bound of threads per principal holds across a
// cluster within countFresh.
type threadCounts struct {
	mu    sync.Mutex
	m     map[string]*threadCount
	asked int // the counts asked of the stream
}

// threadCount is a principal's count: n once done is closed (err: the count failed), from
// the count of at and this store's creations and deletions since it was answered.
type threadCount struct {
	done chan struct{}
	n    int
	err  error
	at   time.Time
}

const (
	// countFresh is how long a principal's thread count is used.
	countFresh = 5 * time.Second
	// maxCounts bounds the principals whose counts are kept.
	maxCounts = 10000
)

// threadCount returns how many threads the principal has (threadCounts).
func (s *Store) threadCount(ctx context.Context, principal string) (int, error) {
	c := &s.counts
	c.mu.Lock()
	e := c.m[principal]
	if e == nil || !e.at.IsZero() && time.Since(e.at) > countFresh {
		if c.m == nil {
			c.m = map[string]*threadCount{}
		}
		if len(c.m) >= maxCounts {
			for p, old := range c.m {
				if !old.at.IsZero() && time.Since(old.at) > countFresh {
					delete(c.m, p)
				}
			}
		}
		e = &threadCount{done: make(chan struct{})}
		c.m[principal] = e
		c.asked++
		c.mu.Unlock()
		if countHook != nil {
			countHook(principal)
		}
		n, err := s.countThreads(ctx, principal)
		c.mu.Lock()
		e.n, e.err, e.at = n, err, time.Now() // nothing was counted while it was asked (counted)
		if err != nil && c.m[principal] == e {
			delete(c.m, principal) // the next run asks again
		}
		close(e.done)
		defer c.mu.Unlock()
		return e.n, e.err
	}
	c.mu.Unlock()
	select {
	case <-e.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.n, e.err
}

// counted adds delta (a thread this store created, 1, or deleted, -1) to the principal's
// count, if it keeps one. A creation or deletion while the count is asked may be in its
// answer already, and is left to it: counted as well, each creation during the count was
// counted twice, and a principal creating threads fast was refused 12 short of 10,000. One the
// answer missed counts at the next count (countFresh): a creation lets one more thread pass
// meanwhile, as runs started at the same moment may; a deletion refuses one too soon.
func (s *Store) counted(principal string, delta int) {
	c := &s.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[principal]; e != nil && !e.at.IsZero() {
		e.n += delta
	}
}

// countHook, when set (by tests), is called as a principal's count is asked.
var countHook func(principal string)

// threadListWait bounds the wait for one batch of a thread list's heads.
const threadListWait = 5 * time.Second
