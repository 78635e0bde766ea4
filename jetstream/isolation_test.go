package jetstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	nats "github.com/nats-io/nats.go"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/jetstream/lease"
	"github.com/wsgateway/wsgateway/protocol"
)

// TestForeignCreateTouchesNothing has another principal try to create a running run, through
// the owner's store and through another process's store, at generation 1 and 2: each attempt
// is refused, and the owner's writer keeps its lease through several renewals, its metadata is
// not rewritten and its log holds only its own events.
func TestForeignCreateTouchesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 900 * time.Millisecond
	cfg.ReapInterval = 150 * time.Millisecond
	a := openStore(t, cfg) // the owner's store, runs the embedded server
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg) // another gateway's store
	ctx := context.Background()

	for gen := uint64(1); gen <= 2; gen++ {
		w, err := a.Create(ctx, "alice", "r", "t")
		if err != nil {
			t.Fatal(err)
		}
		if w.Info().Generation != gen {
			t.Fatalf("Generation = %d, want %d", w.Info().Generation, gen)
		}
		events := [][]byte{event("own", 0), event("own", 1)}
		offs := mustAppend(t, w, events[:1])
		metaBefore, err := a.meta.Get(ctx, runKey("r"))
		if err != nil {
			t.Fatal(err)
		}
		// Several attempts, spread over more than two renewal periods.
		for i := range 6 {
			for _, s := range []*Store{a, b} {
				if _, err := s.Create(ctx, "mallory", "r", "t"); !errors.Is(err, ErrForbidden) {
					t.Fatalf("gen %d: Create by another principal = %v, want ErrForbidden", gen, err)
				}
			}
			l, err := a.leaseKV.Get(ctx, runKey("r"))
			if err != nil {
				t.Fatalf("gen %d, attempt %d: the owner's lease: %v", gen, i, err)
			}
			var got lease.Value
			if err := json.Unmarshal(l.Value(), &got); err != nil || got.Owner != a.cfg.Owner || got.Gen != gen {
				t.Fatalf("gen %d, attempt %d: lease = %s, want the owner's (%s, gen %d)", gen, i, l.Value(), a.cfg.Owner, gen)
			}
			time.Sleep(cfg.LeaseTTL / 4)
		}
		select {
		case <-w.Lost():
			t.Fatalf("gen %d: the owner's writer lost its lease: %v", gen, w.Err())
		default:
		}
		if m, err := a.meta.Get(ctx, runKey("r")); err != nil || m.Revision() != metaBefore.Revision() {
			t.Fatalf("gen %d: metadata revision %v (%v), want %d unchanged", gen, m, err, metaBefore.Revision())
		}
		offs = append(offs, mustAppend(t, w, events[1:])...)
		if err := w.Close(ctx); err != nil {
			t.Fatalf("gen %d: Close = %v", gen, err)
		}
		r, err := b.Read(ctx, "alice", "r", FromStart)
		if err != nil {
			t.Fatal(err)
		}
		checkEntries(t, "the owner's log", readAll(t, r), events, offs)
		info, err := b.Run(ctx, "alice", "r")
		if err != nil || info.State != RunClosed || info.Reaped || info.Generation != gen {
			t.Fatalf("Run = %+v, %v; want closed by its writer at generation %d", info, err, gen)
		}
	}
	// A closed run is refused too, and keeps no lease of the refused attempt.
	if _, err := b.Create(ctx, "mallory", "r", "t"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("Create of a closed run by another principal = %v, want ErrForbidden", err)
	}
	if l, err := a.leaseKV.Get(ctx, runKey("r")); err == nil {
		t.Fatalf("a refused Create left a lease: %s", l.Value())
	}
}

// TestReaperAfterTerminal stops a producer at each step of the end of its turn and checks
// that the reaper leaves every log with exactly one terminal, then its close, a sequence the
// AG-UI verifier accepts.
func TestReaperAfterTerminal(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 900 * time.Millisecond
	cfg.ReapInterval = 150 * time.Millisecond
	a := openStore(t, cfg) // runs the embedded server
	cfg.URLs = a.ClientURL()
	producer := openStore(t, cfg)
	ctx := context.Background()

	const (
		started  = `{"type":"RUN_STARTED","threadId":"t","runId":"%s"}`
		message  = `{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}` + "\n" + `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"hi"}` + "\n" + `{"type":"TEXT_MESSAGE_END","messageId":"m"}`
		finished = `{"type":"RUN_FINISHED","threadId":"t","runId":"%s"}`
		failed   = `{"type":"RUN_ERROR","message":"boom","code":"agent_error"}`
	)
	tests := []struct {
		name     string
		terminal string // the producer's terminal, "" for none
		// stop is how the producer stops once its events before the terminal are stored.
		stop     func(t *testing.T, w *Writer, terminal []byte)
		wantLast string // the type of the log's last event
	}{
		{"no terminal", "", func(t *testing.T, w *Writer, _ []byte) {}, "RUN_ERROR"},
		{"finished, no close", finished, func(t *testing.T, w *Writer, term []byte) {
			mustAppend(t, w, [][]byte{term})
		}, "RUN_FINISHED"},
		{"error, no close", failed, func(t *testing.T, w *Writer, term []byte) {
			mustAppend(t, w, [][]byte{term})
		}, "RUN_ERROR"},
		{"after close record", finished, func(t *testing.T, w *Writer, term []byte) {
			mustAppend(t, w, [][]byte{term})
			// The close record is stored; the producer dies before the metadata says so.
			if _, err := w.publish(ctx, nil, ctlClose); err != nil {
				t.Fatal(err)
			}
		}, "RUN_FINISHED"},
		{"terminal stored, its acknowledgement lost", finished, func(t *testing.T, w *Writer, term []byte) {
			// The producer's publish of the terminal is stored, and it dies before the
			// acknowledgement reaches it.
			w.batches++
			id := w.msgIDPre + "x" + strconv.FormatUint(w.batches, 10)
			if _, err := w.s.publishAfter(ctx, w.acks, w.st, w.subject, w.info.Generation, w.lastSeq, id, encodeBatch(nil, [][]byte{term}), ""); err != nil {
				t.Fatal(err)
			}
		}, "RUN_FINISHED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := strings.ReplaceAll(tt.name, " ", "-")
			run = strings.ReplaceAll(run, ",", "")
			w, err := producer.Create(ctx, "alice", run, "t")
			if err != nil {
				t.Fatal(err)
			}
			var events [][]byte
			events = append(events, fmt.Appendf(nil, started, run))
			for _, l := range strings.Split(message, "\n") {
				events = append(events, []byte(l))
			}
			mustAppend(t, w, events)
			var term []byte
			if tt.terminal != "" {
				term = []byte(strings.ReplaceAll(tt.terminal, "%s", run))
			}
			tt.stop(t, w, term)
			w.s.forget(w) // the producer is gone: it neither renews nor closes
			r, err := a.Read(ctx, "alice", run, FromStart)
			if err != nil {
				t.Fatal(err)
			}
			var ndjson bytes.Buffer
			terminals := 0
			var last string
			for _, e := range readAll(t, r) {
				var ev struct {
					Type string `json:"type"`
				}
				json.Unmarshal(e.Event, &ev)
				if ev.Type == "RUN_FINISHED" || ev.Type == "RUN_ERROR" {
					terminals++
				}
				last = ev.Type
				ndjson.Write(e.Event)
				ndjson.WriteByte('\n')
			}
			if terminals != 1 || last != tt.wantLast {
				t.Fatalf("log = %s; want one terminal, %s, last", ndjson.String(), tt.wantLast)
			}
			if err := protocol.VerifyStream(&ndjson, io.Discard, protocol.PipelineOptions{}); err != nil {
				t.Fatalf("VerifyStream(log) = %v", err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				info, err := a.Run(ctx, "alice", run)
				if err == nil && info.State == RunClosed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("Run = %+v, %v; want closed", info, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			w.Close(ctx)
		})
	}
}

// TestCloseTimeoutReleasesLease: a Close whose context expires while appends are still
// pending leaves the log open, and stops renewing the lease, so that a reaper closes the log.
func TestCloseTimeoutReleasesLease(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 900 * time.Millisecond
	cfg.ReapInterval = 150 * time.Millisecond
	a := openStore(t, cfg) // the producer's store, runs the embedded server
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg) // another process's store, whose reaper closes the log
	ctx := context.Background()
	w, err := a.Create(ctx, "alice", "close-timeout", "t")
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	stored := make(chan error, n)
	big := bytes.Repeat([]byte("x"), 32<<10)
	for range n {
		w.Append(fmt.Appendf(nil, `{"type":"CUSTOM","name":"pad","value":"%s"}`, big), func(_ string, err error) { stored <- err })
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.Close(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with pending appends and an expired context = %v, want context.Canceled", err)
	}
	for range n {
		if err := <-stored; err != nil {
			t.Fatalf("a pending append after Close: %v", err)
		}
	}
	deadline := time.Now().Add(4*cfg.LeaseTTL + 5*time.Second)
	for {
		info, err := b.Run(ctx, "alice", "close-timeout")
		if err == nil && info.State == RunClosed && info.Reaped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run = %+v, %v: the log of a writer whose Close timed out was not reaped", info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	entries, closed, err := b.Snapshot(ctx, "alice", "close-timeout")
	if err != nil || !closed || len(entries) != n+1 || string(entries[n].Event) != string(ProducerLost) {
		t.Fatalf("Snapshot = %d entries, closed %v, %v; want %d events, producer_lost, closed", len(entries), closed, err, n)
	}
}

// TestAcksLateAnswersBurst: the answers of many attempts given up on arrive in one burst with
// the current attempt's, as after a reconnection, when nats.go sends every buffered request at
// once: the current answer is not lost to a full channel, and the publish succeeds.
func TestAcksLateAnswersBurst(t *testing.T) {
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()})
	var down atomic.Bool
	px := tcpproxy.Start(t, strings.TrimPrefix(ns.ClientURL(), "nats://"), func([]byte) bool { return down.Load() })
	cfg := testConfig(t)
	cfg.URLs = "nats://" + px.Addr()
	s := openStore(t, cfg)
	ctx := context.Background()
	a, err := s.newAcks()
	if err != nil {
		t.Fatal(err)
	}
	defer a.release()
	subject := s.cfg.SubjectPrefix + ".late"
	msg := func() *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte("x")
		return m
	}
	// One processor: the connection's reader hands out a whole burst before the publisher
	// runs again, as a busy machine does.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	down.Store(true)
	px.Cut()
	for s.nc.Status() == nats.CONNECTED {
		time.Sleep(time.Millisecond)
	}
	// While the connection is down, attempts are buffered, and given up on.
	for range 20 {
		if _, err := a.publish(ctx, msg(), 0); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
	}
	type answer struct {
		seq uint64
		err error
	}
	done := make(chan answer, 1)
	go func() {
		seq, err := a.publish(ctx, msg(), 10*time.Second)
		done <- answer{seq, err}
	}()
	time.Sleep(100 * time.Millisecond) // the last attempt is buffered too
	down.Store(false)
	got := <-done
	if got.err != nil {
		t.Fatalf("publish after 20 attempts given up on = %v: its answer was dropped", got.err)
	}
	if last, err := s.firstStream().GetLastMsgForSubject(ctx, subject); err != nil || last.Sequence != got.seq {
		t.Fatalf("acknowledged sequence %d, last stored %v (%v)", got.seq, last, err)
	}
}
