package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig returns a config for tests: short timers, the test's logger discarded.
func testConfig(tb testing.TB) Config {
	tb.Helper()
	return Config{
		DataDir:        tb.TempDir(),
		LeaseTTL:       3 * time.Second,
		JoinWait:       300 * time.Millisecond,
		PublishTimeout: 2 * time.Second,
	}
}

// openStore opens a store closed at the end of the test.
func openStore(tb testing.TB, cfg Config) *Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func event(run string, i int) []byte {
	return fmt.Appendf(nil, `{"type":"TEXT_MESSAGE_CONTENT","messageId":"%s","delta":"e%d "}`, run, i)
}

// result is one stored callback.
type result struct {
	offset string
	err    error
}

// appendAll appends events and waits for every callback; it returns their results in order.
func appendAll(tb testing.TB, w *Writer, events [][]byte) []result {
	tb.Helper()
	ch := make(chan result, len(events))
	for _, e := range events {
		w.Append(e, func(off string, err error) { ch <- result{off, err} })
	}
	out := make([]result, 0, len(events))
	timeout := time.After(60 * time.Second)
	for range events {
		select {
		case r := <-ch:
			out = append(out, r)
		case <-timeout:
			tb.Fatalf("appendAll: %d of %d callbacks after 60s", len(out), len(events))
		}
	}
	return out
}

// mustAppend appends events, fails the test on any error, and returns their offsets.
func mustAppend(tb testing.TB, w *Writer, events [][]byte) []string {
	tb.Helper()
	var offs []string
	for i, r := range appendAll(tb, w, events) {
		if r.err != nil {
			tb.Fatalf("Append(%s) = %v", events[i], r.err)
		}
		offs = append(offs, r.offset)
	}
	return offs
}

// readAll reads r to EOF within a bound.
func readAll(tb testing.TB, r *Reader) []Entry {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	entries, err := drain(ctx, r)
	if err != nil {
		tb.Fatalf("read: %v after %d entries", err, len(entries))
	}
	return entries
}

func drain(ctx context.Context, r *Reader) ([]Entry, error) {
	defer r.Close()
	var entries []Entry
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			return entries, err
		}
		entries = append(entries, e)
	}
}

// checkEntries compares entries with the expected events and offsets, in order.
func checkEntries(tb testing.TB, what string, got []Entry, events [][]byte, offsets []string) {
	tb.Helper()
	if len(got) != len(events) {
		tb.Fatalf("%s: got %d entries, want %d (first got %q)", what, len(got), len(events), firstEvents(got))
	}
	for i := range got {
		if string(got[i].Event) != string(events[i]) || got[i].Offset != offsets[i] {
			tb.Fatalf("%s: entry %d = (%s, %s), want (%s, %s)", what, i, got[i].Offset, got[i].Event, offsets[i], events[i])
		}
	}
}

func firstEvents(es []Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i == 3 {
			break
		}
		b.Write(e.Event)
	}
	return b.String()
}

// firstStream is the store's stream 0, where a store with one stream keeps every run.
func (s *Store) firstStream() natsjs.Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shards[0].stream
}
