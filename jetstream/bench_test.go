package jetstream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// benchEvent is a typical content delta.
var benchEvent = []byte(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg-1724320000000","delta":"token "}`)

// benchStore opens an embedded store and a raw JetStream context on the same server.
func benchStore(b *testing.B) (*Store, natsjs.JetStream) {
	b.Helper()
	cfg := testConfig(b)
	cfg.LeaseTTL = time.Minute
	s := openStore(b, cfg)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	return s, js
}

// BenchmarkAppend measures durable events/s of one run appending as fast as it can: group
// commit with fencing and dedup, every event acknowledged.
func BenchmarkAppend(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	w, err := s.Create(ctx, "bench", "append", "t")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(b.N)
	stored := func(_ string, err error) {
		if err != nil {
			b.Error(err)
		}
		wg.Done()
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		w.Append(benchEvent, stored)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.StopTimer()
	w.Close(ctx)
}

// BenchmarkAppendRuns measures appends of 16 concurrent runs.
func BenchmarkAppendRuns(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	const runs = 16
	var writers []*Writer
	for i := range runs {
		w, err := s.Create(ctx, "bench", fmt.Sprintf("run-%d", i), "t")
		if err != nil {
			b.Fatal(err)
		}
		writers = append(writers, w)
	}
	var wg sync.WaitGroup
	wg.Add(b.N)
	stored := func(_ string, err error) {
		if err != nil {
			b.Error(err)
		}
		wg.Done()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		writers[i%runs].Append(benchEvent, stored)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.StopTimer()
	for _, w := range writers {
		w.Close(ctx)
	}
}

// BenchmarkRawPublishAsync is the baseline of BenchmarkAppend: one message per event with
// js.PublishAsync on the same server and stream, no fencing, no dedup id.
func BenchmarkRawPublishAsync(b *testing.B) {
	s, js := benchStore(b)
	subject := s.cfg.SubjectPrefix + ".raw"
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := js.PublishAsync(subject, benchEvent, natsjs.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("PublishAsync did not complete")
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkAppendLatency measures append-to-ack latency of single events on an idle run.
func BenchmarkAppendLatency(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	w, err := s.Create(ctx, "bench", "latency", "t")
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	done := make(chan error, 1)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		w.Append(benchEvent, func(_ string, err error) { done <- err })
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	w.Close(ctx)
}

const replayEvents = 100_000

// BenchmarkReplay measures reading a closed 100k-event log from the start with a Reader.
func BenchmarkReplay(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	w, err := s.Create(ctx, "bench", "replay", "t")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(replayEvents)
	for range replayEvents {
		w.Append(benchEvent, func(_ string, err error) {
			if err != nil {
				b.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	if err := w.Close(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		r, err := s.Read(ctx, "bench", "replay", FromStart)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			if _, err := r.Next(ctx); err != nil {
				break
			}
			n++
		}
		r.Close()
		if n != replayEvents {
			b.Fatalf("replayed %d events, want %d", n, replayEvents)
		}
	}
	b.ReportMetric(float64(b.N*replayEvents)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkRawReplay is the baseline of BenchmarkReplay: a raw ordered consumer reading 100k
// one-event messages.
func BenchmarkRawReplay(b *testing.B) {
	s, js := benchStore(b)
	ctx := context.Background()
	subject := s.cfg.SubjectPrefix + ".rawreplay"
	for range replayEvents {
		if _, err := js.PublishAsync(subject, benchEvent, natsjs.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		cons, err := js.OrderedConsumer(ctx, s.cfg.Stream, natsjs.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		for range replayEvents {
			if _, err := it.Next(natsjs.NextContext(ctx)); err != nil {
				b.Fatal(err)
			}
		}
		it.Stop()
	}
	b.ReportMetric(float64(b.N*replayEvents)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkTurnStart measures a new run's start as a turn sees it: Create, then its first
// event (the run.accepted marker) stored, one run after another. Its p50 and p99 are the
// time to the first event a client can receive.
func BenchmarkTurnStart(b *testing.B) {
	s, _ := benchStore(b)
	benchTurnStart(b, s)
}

// BenchmarkTurnStartCluster is BenchmarkTurnStart on a 3-node cluster with 3 replicas,
// where every write is a round of the stream's or bucket's replicas.
func BenchmarkTurnStartCluster(b *testing.B) {
	nodes := startCluster(b)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.ClientURL())
	}
	benchTurnStart(b, openClusterStore(b, strings.Join(urls, ",")))
}

func benchTurnStart(b *testing.B, s *Store) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	stored := make(chan error, 1)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		w, err := s.Create(ctx, "bench", fmt.Sprintf("start-%d", i), "t")
		if err != nil {
			b.Fatal(err)
		}
		w.Append(benchEvent, func(_ string, err error) { stored <- err })
		if err := <-stored; err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		w.Close(ctx)
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
