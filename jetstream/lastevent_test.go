package jetstream

import (
	"context"
	"strconv"
	"testing"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TestLastEvent: LastEvent answers a closed log's last event, waits for an open log's close,
// and reads a log closed without Wsg-After (by an older gateway) from its start.
func TestLastEvent(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	terminal := []byte(`{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`)
	write := func(runID string) *Writer {
		w, err := s.Create(ctx, "p", runID, "t")
		if err != nil {
			t.Fatalf("Create(%s) = %v", runID, err)
		}
		mustAppend(t, w, [][]byte{event(runID, 1), event(runID, 2)})
		return w
	}

	w := write("closed")
	mustAppend(t, w, [][]byte{terminal})
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LastEvent(ctx, "p", "closed"); err != nil || string(got) != string(terminal) {
		t.Errorf("LastEvent of a closed log = %s, %v, want %s", got, err, terminal)
	}

	w = write("open")
	got := make(chan string, 1)
	go func() {
		ev, err := s.LastEvent(ctx, "p", "open")
		got <- string(ev) + " " + strconv.Quote(errString(err))
	}()
	time.Sleep(100 * time.Millisecond) // LastEvent opens its reader before the terminal, most often
	mustAppend(t, w, [][]byte{terminal})
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != string(terminal)+` ""` {
		t.Errorf("LastEvent of a log closed meanwhile = %s, want %s", g, terminal)
	}

	// A close record as an older gateway wrote it: no Wsg-After.
	w = write("legacy")
	last := event("legacy", 3)
	mustAppend(t, w, [][]byte{last})
	m := nats.NewMsg(w.subject)
	m.Header.Set(hdrGen, strconv.FormatUint(w.info.Generation, 10))
	m.Header.Set(hdrCtl, ctlClose)
	m.Header.Set(natsjs.ExpectedLastSubjSeqHeader, strconv.FormatUint(w.lastSeq, 10))
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LastEvent(ctx, "p", "legacy"); err != nil || string(got) != string(last) {
		t.Errorf("LastEvent of a log closed without Wsg-After = %s, %v, want %s", got, err, last)
	}
	if _, err := s.LastEvent(ctx, "p", "no-such-run"); err == nil {
		t.Error("LastEvent of an unknown run answered")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
