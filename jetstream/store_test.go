package jetstream

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/jetstream/lease"
)

func TestAppendReadClose(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready = %v", err)
	}
	runID := "run.with spaces*>\x00é" + strings.Repeat("x", 10<<10)
	w, err := s.Create(ctx, "alice", runID, "thread-1")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	var events [][]byte
	for i := range 100 {
		events = append(events, event("a", i))
	}
	offs := mustAppend(t, w, events)
	for i := 1; i < len(offs); i++ {
		if offs[i] <= offs[i-1] {
			t.Fatalf("offset %d %q not after %q", i, offs[i], offs[i-1])
		}
		if strings.ContainsAny(offs[i], " \t\r\n\x00") || offs[i] == "" {
			t.Fatalf("offset %q has forbidden characters", offs[i])
		}
	}
	tail, err := s.Read(ctx, "alice", runID, FromStart)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	entries, closed, err := s.Snapshot(ctx, "alice", runID)
	if err != nil || closed {
		t.Fatalf("Snapshot = closed %v, %v; want open, nil", closed, err)
	}
	checkEntries(t, "snapshot of open log", entries, events, offs)
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	checkEntries(t, "tail from -1", readAll(t, tail), events, offs)
	for _, k := range []int{0, 41, 99} {
		r, err := s.Read(ctx, "alice", runID, offs[k])
		if err != nil {
			t.Fatalf("Read after %d: %v", k, err)
		}
		checkEntries(t, "read after offset", readAll(t, r), events[k+1:], offs[k+1:])
	}
	r, err := s.Read(ctx, "alice", runID, FromNow)
	if err != nil {
		t.Fatalf("Read now: %v", err)
	}
	checkEntries(t, "read now of closed log", readAll(t, r), nil, nil)
	entries, closed, err = s.Snapshot(ctx, "alice", runID)
	if err != nil || !closed {
		t.Fatalf("Snapshot = closed %v, %v; want closed", closed, err)
	}
	checkEntries(t, "snapshot of closed log", entries, events, offs)
	info, err := s.Run(ctx, "alice", runID)
	if err != nil || info.State != RunClosed || info.ThreadID != "thread-1" || info.Generation != 1 || info.Closed.IsZero() {
		t.Fatalf("Run = %+v, %v", info, err)
	}
	var got error
	w.Append(event("a", 100), func(_ string, err error) { got = err })
	if !errors.Is(got, ErrClosed) {
		t.Fatalf("Append after Close = %v, want ErrClosed", got)
	}
}

func TestReadErrors(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "r1", "t")
	if err != nil {
		t.Fatal(err)
	}
	offs := mustAppend(t, w, [][]byte{event("r1", 0), event("r1", 1)})
	// upper is a valid offset spelt in upper case: append, one message at a time, until an
	// offset has a hex letter to change (its sequence reaches 0xa at the latest).
	var upper string
	for i := 2; i < 20 && upper == ""; i++ {
		if o := mustAppend(t, w, [][]byte{event("r1", i)})[0]; strings.ToUpper(o) != o {
			upper = strings.ToUpper(o)
		}
	}
	if upper == "" {
		t.Fatal("no offset with a hex letter after 20 appends")
	}
	w2, err := s.Create(ctx, "alice", "r2", "t")
	if err != nil {
		t.Fatal(err)
	}
	foreign := mustAppend(t, w2, [][]byte{event("r2", 0)})[0]
	last, _ := parseOffset(offs[1])
	pastIdx, pastSeq := last, last
	pastIdx.idx = 7
	pastSeq.seq += 1000
	epoch := last
	epoch.tag = offsetTag("another-epoch", logKey("alice", "r1"))
	oldGen := last
	oldGen.gen = 0x99
	tests := []struct {
		name, principal, runID, after string
		want                          error
	}{
		{"unknown run", "alice", "nope", FromNow, ErrUnknownRun},
		{"unknown run join", "alice", "nope", FromStart, ErrUnknownRun},
		{"another principal", "bob", "r1", FromStart, ErrUnknownRun},
		{"another principal offset", "bob", "r1", offs[0], ErrUnknownRun},
		{"malformed", "alice", "r1", "12", ErrInvalidOffset},
		{"empty", "alice", "r1", "", ErrInvalidOffset},
		{"uppercase", "alice", "r1", upper, ErrInvalidOffset},
		{"foreign run", "alice", "r1", foreign, ErrInvalidOffset},
		{"past the end idx", "alice", "r1", pastIdx.String(), ErrInvalidOffset},
		{"past the end seq", "alice", "r1", pastSeq.String(), ErrInvalidOffset},
		{"other epoch", "alice", "r1", epoch.String(), ErrInvalidOffset},
		{"other generation", "alice", "r1", oldGen.String(), ErrInvalidOffset},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := s.Read(ctx, tt.principal, tt.runID, tt.after)
			if !errors.Is(err, tt.want) {
				if r != nil {
					r.Close()
				}
				t.Fatalf("Read(%q, %q, %q) = %v, want %v", tt.principal, tt.runID, tt.after, err, tt.want)
			}
		})
	}
	if _, err := s.Create(ctx, "bob", "r1", "t"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("Create by another principal = %v, want ErrForbidden", err)
	}
	if _, err := s.Run(ctx, "bob", "r1"); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("Run by another principal = %v, want ErrUnknownRun", err)
	}
	for _, w := range []*Writer{w, w2} {
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestJoinWaitsForCreate(t *testing.T) {
	cfg := testConfig(t)
	cfg.JoinWait = 5 * time.Second
	s := openStore(t, cfg)
	ctx := context.Background()
	type opened struct {
		r   *Reader
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		r, err := s.Read(ctx, "alice", "late", FromStart)
		ch <- opened{r, err}
	}()
	time.Sleep(200 * time.Millisecond)
	w, err := s.Create(ctx, "alice", "late", "t")
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{event("late", 0), event("late", 1)}
	offs := mustAppend(t, w, events)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-ch
	if o.err != nil {
		t.Fatalf("Read -1 before Create = %v", o.err)
	}
	checkEntries(t, "join", readAll(t, o.r), events, offs)
}

func TestResubmitStartsGeneration(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	w1, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatal(err)
	}
	old := mustAppend(t, w1, [][]byte{event("g1", 0), event("g1", 1)})
	tail, err := s.Read(ctx, "alice", "r", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	var seen []Entry
	for range 2 {
		e, err := tail.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, e)
	}
	w2, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatalf("resubmit Create: %v", err)
	}
	// The first writer is fenced out: its next append fails and Lost fires.
	if r := appendAll(t, w1, [][]byte{event("g1", 2)}); !errors.Is(r[0].err, ErrFenced) {
		t.Fatalf("Append by the replaced writer = %v, want ErrFenced", r[0].err)
	}
	select {
	case <-w1.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost did not fire for the replaced writer")
	}
	events := [][]byte{event("g2", 0), event("g2", 1), event("g2", 2)}
	offs := mustAppend(t, w2, events)
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, o := range old {
		if _, err := s.Read(ctx, "alice", "r", o); !errors.Is(err, ErrInvalidOffset) {
			t.Fatalf("Read(old offset %s) = %v, want ErrInvalidOffset", o, err)
		}
	}
	r, err := s.Read(ctx, "alice", "r", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, "new generation", readAll(t, r), events, offs)
	// The tail opened on the first generation saw its events, then the resubmit.
	checkEntries(t, "old tail", seen, [][]byte{event("g1", 0), event("g1", 1)}, old)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if got, err := drain(ctx2, tail); !errors.Is(err, ErrInvalidOffset) || len(got) != 0 {
		t.Fatalf("old tail after resubmit = %d entries, %v; want 0, ErrInvalidOffset", len(got), err)
	}
	info, _ := s.Run(ctx, "alice", "r")
	if info.Generation != 2 {
		t.Fatalf("Generation = %d, want 2", info.Generation)
	}
	w1.Close(ctx)
}

func TestReaperClosesLostRun(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 1500 * time.Millisecond
	cfg.ReapInterval = 250 * time.Millisecond
	reaped := make(chan struct{}, 4)
	cfg.Metrics = &Metrics{RunReaped: func() { reaped <- struct{}{} }}
	a := openStore(t, cfg) // runs the embedded server
	cfg.URLs = a.ClientURL()
	a2 := openStore(t, cfg) // the producer's store
	b := openStore(t, cfg)  // another process's store: three reapers compete
	ctx := context.Background()

	w, err := a2.Create(ctx, "alice", "crash", "t")
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{event("c", 0), event("c", 1), event("c", 2)}
	offs := mustAppend(t, w, events)
	tail, err := b.Read(ctx, "alice", "crash", offs[0])
	if err != nil {
		t.Fatal(err)
	}
	// Still renewing: outlives several TTLs.
	time.Sleep(3 * cfg.LeaseTTL)
	if info, _ := b.Run(ctx, "alice", "crash"); info.State != RunOpen {
		t.Fatalf("a renewing producer's run was closed: %+v", info)
	}
	w.s.forget(w) // the producer stops renewing without closing: a crash
	stopped := time.Now()
	got := readAll(t, tail)
	elapsed := time.Since(stopped)
	want := append(append([][]byte{}, events[1:]...), ProducerLost)
	if len(got) != 3 || string(got[0].Event) != string(events[1]) || string(got[1].Event) != string(events[2]) ||
		string(got[2].Event) != string(ProducerLost) {
		t.Fatalf("tail after crash = %q, want %q", firstEvents(got), want)
	}
	if bound := cfg.LeaseTTL + cfg.ReapInterval + 2*time.Second; elapsed > bound {
		t.Fatalf("reaped after %v, want within %v", elapsed, bound)
	}
	if r := appendAll(t, w, [][]byte{event("c", 3)}); !errors.Is(r[0].err, ErrFenced) {
		t.Fatalf("Append after reap = %v, want ErrFenced", r[0].err)
	}
	select {
	case <-w.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire")
	}
	select {
	case <-reaped:
	case <-time.After(5 * time.Second):
		t.Fatal("RunReaped not called")
	}
	info, err := b.Run(ctx, "alice", "crash")
	if err != nil || info.State != RunClosed || !info.Reaped {
		t.Fatalf("Run after reap = %+v, %v", info, err)
	}
	time.Sleep(3 * cfg.ReapInterval)
	if n := len(reaped); n != 0 {
		t.Fatalf("run reaped %d more times", n)
	}
	entries, closed, err := b.Snapshot(ctx, "alice", "crash")
	if err != nil || !closed || len(entries) != 4 {
		t.Fatalf("Snapshot = %d entries, closed %v, %v; want 4, closed", len(entries), closed, err)
	}
	if err := w.Close(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("Close of a fenced writer = %v, want ErrFenced", err)
	}

	// A process that stops with a run still open releases its lease; another reaps it.
	w2, err := a2.Create(ctx, "alice", "left-open", "t")
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, w2, [][]byte{event("l", 0)})
	a2.Close()
	r, err := b.Read(ctx, "alice", "left-open", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	got = readAll(t, r)
	if len(got) != 2 || string(got[1].Event) != string(ProducerLost) {
		t.Fatalf("run left open by a stopped store = %q", firstEvents(got))
	}
}

func TestRetentionAgesOut(t *testing.T) {
	cfg := testConfig(t)
	cfg.Retention = time.Second
	cfg.DedupWindow = time.Second
	cfg.PublishTimeout = 500 * time.Millisecond
	s := openStore(t, cfg)
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "old", "t")
	if err != nil {
		t.Fatal(err)
	}
	offs := mustAppend(t, w, [][]byte{event("o", 0)})
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := s.Read(ctx, "alice", "old", offs[0])
		if errors.Is(err, ErrUnknownRun) {
			break
		}
		if r != nil {
			r.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("Read of a run past retention = %v, want ErrUnknownRun", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	start := time.Now()
	if _, err := s.Read(ctx, "alice", "old", FromNow); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("Read now of aged-out run = %v", err)
	}
	if d := time.Since(start); d > cfg.JoinWait {
		t.Fatalf("Read of an aged-out run took %v", d)
	}
}

// TestPersistence stops the server mid-run and starts it again on the same directory: the
// log and its offsets survive, an open tail resumes, and appends made meanwhile are stored.
func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	port := testenv.FreePort(t)
	ns := testenv.StartNATS(t, server.Options{Port: port, StoreDir: dir})
	cfg := testConfig(t)
	cfg.URLs = ns.ClientURL()
	cfg.LeaseTTL = 30 * time.Second
	s := openStore(t, cfg)
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "durable", "t")
	if err != nil {
		t.Fatal(err)
	}
	var events [][]byte
	for i := range 100 {
		events = append(events, event("d", i))
	}
	offs := mustAppend(t, w, events[:50])
	tail, err := s.Read(ctx, "alice", "durable", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	type read struct {
		entries []Entry
		err     error
	}
	tailed := make(chan read, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		es, err := drain(ctx, tail)
		tailed <- read{es, err}
	}()

	ns.Shutdown()
	ns.WaitForShutdown()
	results := make(chan []result, 1)
	go func() { results <- appendAll(t, w, events[50:]) }() // queued while the server is down
	time.Sleep(500 * time.Millisecond)
	testenv.StartNATS(t, server.Options{Port: port, StoreDir: dir})

	for i, r := range <-results {
		if r.err != nil {
			t.Fatalf("Append %d across restart: %v", 50+i, r.err)
		}
		offs = append(offs, r.offset)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rd := <-tailed
	if rd.err != nil {
		t.Fatalf("tail across restart: %v after %d", rd.err, len(rd.entries))
	}
	checkEntries(t, "tail across restart", rd.entries, events, offs)
	r, err := s.Read(ctx, "alice", "durable", offs[10])
	if err != nil {
		t.Fatalf("Read with an offset minted before the restart: %v", err)
	}
	checkEntries(t, "resume after restart", readAll(t, r), events[11:], offs[11:])
}

// TestEmbeddedReopen runs the embedded default twice on one data directory.
func TestEmbeddedReopen(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	s, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(ctx, "alice", "e", "t")
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{event("e", 0), event("e", 1)}
	offs := mustAppend(t, w, events)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if err := s.Ready(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ready after Close = %v", err)
	}
	s = openStore(t, cfg)
	r, err := s.Read(ctx, "alice", "e", offs[0])
	if err != nil {
		t.Fatalf("Read after reopen: %v", err)
	}
	checkEntries(t, "after reopen", readAll(t, r), events[1:], offs[1:])
}

// TestPublishRetry replays what a retry meets: a repeated message id within the dedup window
// is acknowledged with the first sequence and stored once; a retry refused for a wrong last
// sequence recognises its own earlier message, and only its own.
func TestPublishRetry(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	subject := s.cfg.SubjectPrefix + ".retry"
	a, err := s.newAcks()
	if err != nil {
		t.Fatal(err)
	}
	defer a.release()
	first, err := s.publishAfter(ctx, a, s.firstStream(), subject, 1, 0, "id-1", []byte("a"), "")
	if err != nil {
		t.Fatal(err)
	}
	// The server checks the expected last sequence before its duplicate window: a repeated
	// publish is refused as a wrong last sequence (or, were the order reversed, acknowledged
	// as a duplicate of the first); either way it is not stored twice, and storedAfter, which
	// publishAfter consults when a retry is refused, finds the first store.
	again, err := s.publishAfter(ctx, a, s.firstStream(), subject, 1, 0, "id-1", []byte("a"), "")
	if !(err == nil && again == first) && !errors.Is(err, ErrFenced) {
		t.Fatalf("repeat of id-1 = %d, %v; want %d or ErrFenced", again, err, first)
	}
	if seq, ok, err := s.storedAfter(ctx, s.firstStream(), subject, 0, "id-1"); !ok || err != nil || seq != first {
		t.Fatalf("storedAfter(0, id-1) = %d, %v, %v; want %d, true", seq, ok, err, first)
	}
	if _, err := s.publishAfter(ctx, a, s.firstStream(), subject, 1, 0, "id-2", []byte("b"), ""); !errors.Is(err, ErrFenced) {
		t.Fatalf("publish expecting an empty subject = %v, want ErrFenced", err)
	}
	second, err := s.publishAfter(ctx, a, s.firstStream(), subject, 1, first, "id-2", []byte("b"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.storedAfter(ctx, s.firstStream(), subject, first, "id-1"); ok || err != nil {
		t.Fatalf("storedAfter(first, id-1) after id-2 = %v, %v; want false", ok, err)
	}
	if _, _, err := s.storedAfter(ctx, s.firstStream(), subject, second, "id-3"); !errors.Is(err, errNotApplied) {
		t.Fatalf("storedAfter(last) = %v, want errNotApplied", err)
	}
	info, err := s.firstStream().Info(ctx)
	if err != nil || info.State.Msgs != 2 || second != first+1 {
		t.Fatalf("stream holds %d messages (seqs %d, %d), want 2 consecutive", info.State.Msgs, first, second)
	}
}

// TestAcks checks the answers a publisher waits for: a subject no stream stores is refused
// with no responders, an attempt given up on does not lend its late answer to the next one,
// a refusal comes back as JetStream's error, and a released inbox serves the next publisher
// without its predecessor's late answers.
func TestAcks(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	a, err := s.newAcks()
	if err != nil {
		t.Fatal(err)
	}
	msg := func(subject string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte("x")
		return m
	}
	if _, err := a.publish(ctx, msg("nowhere.acks"), 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("publish to a subject no stream stores = %v, want ErrNoResponders", err)
	}
	subject := s.cfg.SubjectPrefix + ".acks"
	// An attempt that gave up (a zero timeout) may be answered later, while the next attempt
	// waits: such an answer, here one that names a sequence never stored, must not be taken
	// for the next attempt's.
	if _, err := a.publish(ctx, msg(subject), 0); err != nil && !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
	if err := s.nc.Publish(a.inbox+"."+strconv.FormatUint(a.n, 10), []byte(`{"stream":"x","seq":999999}`)); err != nil {
		t.Fatal(err)
	}
	seq, err := a.publish(ctx, msg(subject), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.firstStream().GetLastMsgForSubject(ctx, subject)
	if err != nil || last.Sequence != seq {
		t.Fatalf("acknowledged sequence %d, last stored %v (%v)", seq, last, err)
	}
	m := msg(subject)
	m.Header.Set(natsjs.ExpectedLastSubjSeqHeader, "1")
	if _, err := a.publish(ctx, m, 5*time.Second); !bucket.IsWrongLastSeq(err) {
		t.Fatalf("publish expecting a wrong last sequence = %v, want JetStream's refusal", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.publish(cctx, msg(subject), 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("publish with a canceled context = %v, want context.Canceled", err)
	}

	if _, err := a.publish(ctx, msg(subject), 0); err != nil && !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
	late := a.inbox + "." + strconv.FormatUint(a.n, 10)
	a.release()
	b, err := s.newAcks()
	if err != nil {
		t.Fatal(err)
	}
	defer b.release()
	if b != a {
		t.Errorf("a released inbox was not reused: %s, then %s", a.inbox, b.inbox)
	}
	if err := s.nc.Publish(late, []byte(`{"stream":"x","seq":999999}`)); err != nil {
		t.Fatal(err)
	}
	if seq, err = b.publish(ctx, msg(subject), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if last, err := s.firstStream().GetLastMsgForSubject(ctx, subject); err != nil || last.Sequence != seq {
		t.Fatalf("the next publisher on a reused inbox: acknowledged %d, last stored %v (%v)", seq, last, err)
	}
}

// TestCreateOverStrays creates a run whose subject still holds events after its metadata is
// gone (retention removed the metadata first): the new log serves only its own events.
func TestCreateOverStrays(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	w1, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, w1, [][]byte{event("stray", 0), event("stray", 1)})
	if err := w1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.meta.Purge(ctx, runKey("r")); err != nil {
		t.Fatalf("purging the metadata: %v", err)
	}
	w2, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatalf("Create over strays: %v", err)
	}
	events := [][]byte{event("new", 0), event("new", 1), event("new", 2)}
	offs := mustAppend(t, w2, events)
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := s.Read(ctx, "alice", "r", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, "log over strays", readAll(t, r), events, offs)
}

// TestCreateOverDeadCreate: a store that dies between a run's lease and its metadata leaves
// a lease that holds the run until its liveness key lapses. The client, told the run is
// unknown, sends it again; that Create waits the lease out and starts the run, where it used
// to give up after half a second.
func TestCreateOverDeadCreate(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 1500 * time.Millisecond
	cfg.ReapInterval = 250 * time.Millisecond
	s := openStore(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The dead store's liveness key, written last just before it died, and its lease on "r".
	expires := time.Now().Add(cfg.LeaseTTL)
	if _, err := s.leaseKV.Put(ctx, liveKey("dead"), lease.Value{Owner: "dead", Expires: expires.UnixMilli()}.Encode()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.leaseKV.Create(ctx, runKey("r"), lease.Value{Owner: "dead", Expires: math.MaxInt64, Gen: 1, Live: liveKey("dead")}.Encode()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run(ctx, "alice", "r"); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("Run of the dead create = %v, want ErrUnknownRun", err)
	}
	w, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatalf("Create over the dead create's lease: %v", err)
	}
	if time.Now().Before(expires) {
		t.Errorf("Create took the lease of a store still live (until %v)", expires)
	}
	writesOneEvent(t, s, w, "alice", "the run sent again")
}

// TestCreateLeaseFirst: a Create writes a run's metadata only once it holds the run's lease,
// so that no moment exists at which a store that dies leaves metadata without a lease (a run
// open for ever, which no reaper finds). A Create that finds the lease held writes no
// metadata at all, even for a moment.
func TestCreateLeaseFirst(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 500 * time.Millisecond
	s := openStore(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Another store's create, between its lease and its metadata, alive for the whole test.
	if _, err := s.leaseKV.Put(ctx, liveKey("other"), lease.Value{Owner: "other", Expires: time.Now().Add(time.Hour).UnixMilli()}.Encode()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.leaseKV.Create(ctx, runKey("r"), lease.Value{Owner: "other", Expires: math.MaxInt64, Gen: 1, Live: liveKey("other")}.Encode()); err != nil {
		t.Fatal(err)
	}
	watch, err := s.meta.Watch(ctx, runKey("r"), natsjs.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if w, err := s.Create(ctx, "alice", "r", "t"); err == nil {
		w.Close(ctx)
		t.Fatal("Create over a live store's lease succeeded")
	}
	select {
	case e := <-watch.Updates():
		t.Errorf("a Create that never held the lease wrote the run's metadata: %s %q", e.Operation(), e.Value())
	case <-time.After(500 * time.Millisecond):
	}
}

// TestCreateFailedLeavesNoRun: a Create whose open record fails (not fenced: the stream
// refuses it) answers the error and leaves no lease and no metadata, so the run is unknown
// to readers instead of open for ever; a later Create of the run starts it.
func TestCreateFailedLeavesNoRun(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.firstStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc := info.Config
	limit := sc.MaxMsgSize
	sc.MaxMsgSize = 16 // smaller than the open record's headers
	if _, err := s.JetStream().UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if w, err := s.Create(ctx, "p1", "r1", ""); err == nil {
		w.Close(ctx)
		t.Fatal("Create with the open record refused = nil error, want the refusal")
	}
	sc.MaxMsgSize = limit
	if _, err := s.JetStream().UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := s.leaseKV.Get(ctx, runKey("r1")); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("lease after the failed Create: %v, want none", err)
	}
	if _, err := s.Run(ctx, "p1", "r1"); !errors.Is(err, ErrUnknownRun) {
		t.Errorf("Run after the failed Create = %v, want ErrUnknownRun", err)
	}
	if r, err := s.Read(ctx, "p1", "r1", FromStart); !errors.Is(err, ErrUnknownRun) {
		if r != nil {
			r.Close()
		}
		t.Errorf("Read after the failed Create = %v, want ErrUnknownRun (a reader would tail for ever)", err)
	}
	w, err := s.Create(ctx, "p1", "r1", "")
	if err != nil {
		t.Fatalf("Create again: %v", err)
	}
	writesOneEvent(t, s, w, "p1", "the run created again")
}

// writesOneEvent appends an event with w, closes it, and reads the log back: the event alone.
func writesOneEvent(t *testing.T, s *Store, w *Writer, principal, what string) {
	t.Helper()
	ctx := context.Background()
	runID := w.Info().RunID
	offsets := mustAppend(t, w, [][]byte{event(runID, 0)})
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := s.Read(ctx, principal, runID, FromStart)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkEntries(t, what, readAll(t, r), [][]byte{event(runID, 0)}, offsets)
}

// TestEnded: Ended tells a run whose terminal is stored, before and after its close, from one
// still streaming, and refuses an unknown run.
func TestEnded(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Ended(ctx, "alice", "none"); !errors.Is(err, ErrUnknownRun) {
		t.Errorf("Ended of no run = %v, want ErrUnknownRun", err)
	}
	w, err := s.Create(ctx, "alice", "r", "t")
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want bool) {
		t.Helper()
		if got, err := s.Ended(ctx, "alice", "r"); got != want || err != nil {
			t.Errorf("Ended %s = %v, %v; want %v", when, got, err, want)
		}
	}
	check("after the open record", false)
	mustAppend(t, w, [][]byte{event("r", 0)})
	check("while streaming", false)
	mustAppend(t, w, [][]byte{[]byte(`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`)})
	check("with the terminal stored", true)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	check("once closed", true)
	if _, err := s.Ended(ctx, "bob", "r"); !errors.Is(err, ErrUnknownRun) {
		t.Errorf("Ended of another principal's run = %v, want ErrUnknownRun", err)
	}
}

// TestDeleteLaterWhileClosing starts the background delete of a consumer whose creation got
// no answer while the store closes, as a thread's reap does when the gateway shuts down: the
// race detector fails it when deleteLater's goroutine is counted without the store's lock
// that Close takes before it waits for its goroutines.
func TestDeleteLaterWhileClosing(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sh, err := s.shard(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			s.deleteLater(sh.stream, "gone-"+strconv.Itoa(i))
		}
	}()
	s.Close()
	<-done
	s.wg.Wait() // a delete started after Close's wait would still be running here
}
