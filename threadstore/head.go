package threadstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/jetstream"
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
		if err == nil || rev != 0 || !jetstream.IsWrongLastSeq(err) {
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

// threadCount returns how many threads the principal has: the subjects of its heads, which
// the bucket's stream counts in one request (a deleted thread's subject is purged whole,
// DeleteThread; an expired head's message is gone).
func (s *Store) threadCount(ctx context.Context, principal string) (int, error) {
	info, err := s.threadStream.Info(ctx, natsjs.WithSubjectFilter("$KV."+s.cfg.Bucket+"."+principalPrefix(principal)+".*"))
	if err != nil {
		return 0, fmt.Errorf("threads: %w", err)
	}
	return len(info.State.Subjects), nil
}

// threadListWait bounds the wait for one batch of a thread list's heads.
const threadListWait = 5 * time.Second
