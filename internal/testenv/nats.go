package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATS starts a JetStream server on loopback with opts (a random port unless opts has
// one), shut down at the end of the test (Shutdown is idempotent, so tests may stop it
// earlier).
func StartNATS(tb testing.TB, opts server.Options) *server.Server {
	tb.Helper()
	opts.Host = "127.0.0.1"
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	opts.JetStream = true
	opts.NoSigs = true
	opts.NoLog = true
	ns, err := server.NewServer(&opts)
	if err != nil {
		tb.Fatalf("NewServer: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		tb.Fatal("server not ready")
	}
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}
