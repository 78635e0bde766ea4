package jetstream

import (
	"bytes"
	"context"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
)

// ElectedKV is a KV bucket whose reads and writes wait out a leader election. Each attempt is
// bounded by the publish timeout: a request sent while the bucket's lost leader is still
// believed alive is answered by no one, and would otherwise wait as long as the caller's
// context. A request no stream leader heard (no responders: the next leader is not elected
// yet), or not answered in time while the connection is up, is sent again, with backoff, until
// ctx or the store ends or the horizon of publish retries passes. With NATS unreachable, a
// request waits as one request would: until ctx ends, or, where ctx has no deadline, for one
// attempt (a new run's creation fails then, after the publish timeout, as it did when the nats
// client's default timeout bounded it). A conditional write whose retry is refused (the key
// changed, or exists) may have been applied by the attempt that timed out: it succeeded if the
// key now holds the value it wrote (a delete: if the key is gone).
type ElectedKV struct {
	natsjs.KeyValue
	s *Store
}

// Elected returns kv, a bucket on the store's connection, with its reads and writes waiting
// out elections as the store's own buckets do.
func (s *Store) Elected(kv natsjs.KeyValue) ElectedKV { return ElectedKV{kv, s} }

func (k ElectedKV) Get(ctx context.Context, key string) (natsjs.KeyValueEntry, error) {
	var e natsjs.KeyValueEntry
	_, err := k.Retry(ctx, func(ctx context.Context) (uint64, error) {
		var err error
		e, err = k.KeyValue.Get(ctx, key)
		return 0, err
	}, nil)
	return e, err
}

func (k ElectedKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.Retry(ctx, func(ctx context.Context) (uint64, error) { return k.KeyValue.Put(ctx, key, value) }, nil)
}

func (k ElectedKV) Create(ctx context.Context, key string, value []byte, opts ...natsjs.KVCreateOpt) (uint64, error) {
	return k.Retry(ctx, func(ctx context.Context) (uint64, error) { return k.KeyValue.Create(ctx, key, value, opts...) },
		k.Holds(key, value))
}

func (k ElectedKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	return k.Retry(ctx, func(ctx context.Context) (uint64, error) { return k.KeyValue.Update(ctx, key, value, revision) },
		k.Holds(key, value))
}

func (k ElectedKV) Delete(ctx context.Context, key string, opts ...natsjs.KVDeleteOpt) error {
	_, err := k.Retry(ctx, func(ctx context.Context) (uint64, error) { return 0, k.KeyValue.Delete(ctx, key, opts...) },
		func(ctx context.Context) (uint64, bool) {
			_, err := k.KeyValue.Get(ctx, key)
			return 0, errors.Is(err, natsjs.ErrKeyNotFound)
		})
	return err
}

// Holds returns a check that the key holds value, and at which revision.
func (k ElectedKV) Holds(key string, value []byte) func(context.Context) (uint64, bool) {
	return func(ctx context.Context) (uint64, bool) {
		e, err := k.KeyValue.Get(ctx, key)
		if err != nil || !bytes.Equal(e.Value(), value) {
			return 0, false
		}
		return e.Revision(), true
	}
}

// Retry runs op, each attempt bounded by the publish timeout, until it is answered, ctx or
// the store ends, or the horizon of publish retries passes. applied, when set, tells whether
// a refused write was applied by an earlier attempt that went unanswered.
func (k ElectedKV) Retry(ctx context.Context, op func(context.Context) (uint64, error), applied func(context.Context) (uint64, bool)) (uint64, error) {
	deadline := time.Now().Add(k.s.cfg.DedupWindow - k.s.cfg.PublishTimeout)
	backoff := 100 * time.Millisecond
	unanswered := false
	for {
		actx, cancel := context.WithTimeout(ctx, k.s.cfg.PublishTimeout)
		rev, err := op(actx)
		timedOut := err != nil && actx.Err() != nil && ctx.Err() == nil
		if err != nil && unanswered && applied != nil && refused(err) {
			if r, ok := applied(actx); ok {
				cancel()
				return r, nil
			}
		}
		cancel()
		_, bounded := ctx.Deadline()
		if !timedOut && !errors.Is(err, natsjs.ErrNoStreamResponse) || time.Now().After(deadline) ||
			timedOut && !bounded && !k.s.nc.IsConnected() {
			return rev, err
		}
		unanswered = unanswered || timedOut
		if k.s.sleep(ctx, backoff) != nil {
			return rev, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// refused reports whether a conditional write was refused for the key's state.
func refused(err error) bool {
	return bucket.IsWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyExists)
}
