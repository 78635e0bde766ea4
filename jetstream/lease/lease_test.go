package lease

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// claims counts the leases each keeper was handed, by run key.
type claims struct {
	mu sync.Mutex
	by map[string][]string // run key: the owners that claimed it
}

func (c *claims) of(key string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.by[key]...)
}

// keeper returns the keeper owner on its own connection to the server at url: each claimed
// lease is recorded in c and dropped, as the run log drops it once it closed the run.
func keeper(t *testing.T, url, owner string, c *claims) *Keeper {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, bucket.Config("leases", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	var k *Keeper
	k = New(Config{
		Bucket: kv, LiveBucket: kv, Owner: owner, LiveKey: LivePrefix + owner,
		TTL: time.Second, ReapInterval: 100 * time.Millisecond, RequestTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Health: &Health{},
		Changed: func(string, uint64, *Value) {},
		Claimed: func(ctx context.Context, key string, rev uint64) error {
			c.mu.Lock()
			c.by[key] = append(c.by[key], owner)
			c.mu.Unlock()
			return k.Drop(ctx, key, rev)
		},
		PassDone: func() {},
	})
	if err := k.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestClaims holds the judgement of expiry that a dead gateway's turns depend on: the leases
// of a store whose liveness key lapsed are each claimed by exactly one of the live keepers
// watching the bucket (a run closed twice would end twice), a lease whose writer stopped
// without closing its log (Release) is claimed though its store lives, and the leases of a
// store that renews its key are never claimed.
func TestClaims(t *testing.T) {
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()})
	c := &claims{by: map[string][]string{}}
	dead := keeper(t, ns.ClientURL(), "dead", c) // renewed once, never started: it lapses
	a := keeper(t, ns.ClientURL(), "a", c)
	b := keeper(t, ns.ClientURL(), "b", c)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); a.Wait(); b.Wait() }()
	const runs = 20
	for i := range runs {
		if _, err := dead.Create(ctx, fmt.Sprintf("dead%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Create(ctx, "kept", 1); err != nil {
		t.Fatal(err)
	}
	rev, err := a.Create(ctx, "released", 1)
	if err != nil {
		t.Fatal(err)
	}
	a.Start(ctx)
	b.Start(ctx)
	a.Release("released", rev)
	// The dead store lapses a TTL after its one renewal; a keeper claims once JetStream has
	// answered it for a TTL: well within 3 s.
	testenv.WaitFor(t, 10*time.Second, "every dead lease claimed", func() bool {
		for i := range runs {
			if len(c.of(fmt.Sprintf("dead%d", i))) == 0 {
				return false
			}
		}
		return len(c.of("released")) > 0
	})
	time.Sleep(2 * time.Second) // two TTLs more: a second claim would show now
	for i := range runs {
		if got := c.of(fmt.Sprintf("dead%d", i)); len(got) != 1 {
			t.Errorf("dead%d claimed by %v, want exactly one keeper", i, got)
		}
	}
	if got := c.of("released"); len(got) != 1 {
		t.Errorf("the released lease claimed by %v, want exactly one keeper", got)
	}
	if got := c.of("kept"); len(got) != 0 {
		t.Errorf("the lease of a live store was claimed by %v", got)
	}
}
