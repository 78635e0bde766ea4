package jetstream

import (
	"context"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// electedKV is a KV bucket whose writes wait out a leader election. A write that no stream
// leader heard (no responders: the bucket's leader was lost and the next is not elected yet)
// was not applied, so it is sent again, with backoff, until the horizon of publish retries;
// every other answer, a timeout included, is the caller's to judge.
type electedKV struct {
	natsjs.KeyValue
	s *Store
}

func (k electedKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return unheard(ctx, k.s, func() (uint64, error) { return k.KeyValue.Put(ctx, key, value) })
}

func (k electedKV) Create(ctx context.Context, key string, value []byte, opts ...natsjs.KVCreateOpt) (uint64, error) {
	return unheard(ctx, k.s, func() (uint64, error) { return k.KeyValue.Create(ctx, key, value, opts...) })
}

func (k electedKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	return unheard(ctx, k.s, func() (uint64, error) { return k.KeyValue.Update(ctx, key, value, revision) })
}

func (k electedKV) Delete(ctx context.Context, key string, opts ...natsjs.KVDeleteOpt) error {
	_, err := unheard(ctx, k.s, func() (uint64, error) { return 0, k.KeyValue.Delete(ctx, key, opts...) })
	return err
}

// unheard runs op until it is heard by a stream leader, ctx or the store ends, or the
// horizon of publish retries passes.
func unheard(ctx context.Context, s *Store, op func() (uint64, error)) (uint64, error) {
	deadline := time.Now().Add(s.cfg.DedupWindow - s.cfg.PublishTimeout)
	backoff := 100 * time.Millisecond
	for {
		rev, err := op()
		if !errors.Is(err, natsjs.ErrNoStreamResponse) || time.Now().After(deadline) {
			return rev, err
		}
		if s.sleep(ctx, backoff) != nil {
			return rev, err
		}
		backoff = min(2*backoff, time.Second)
	}
}
