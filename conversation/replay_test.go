package conversation_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/conversation"
)

// firstNowFails is a Store whose first "now" reader fails after a second, having sent
// nothing, as a reader whose consumer broke during an outage does: it is opened, closed,
// and handed over a second later, so that its first Next fails.
type firstNowFails struct {
	conversation.Store
	failed atomic.Bool
}

func (f *firstNowFails) Read(ctx context.Context, principal, runID, after string) (conversation.LogReader, error) {
	r, err := f.Store.Read(ctx, principal, runID, after)
	if err != nil || after != "now" || !f.failed.CompareAndSwap(false, true) {
		return r, err
	}
	r.Close()
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	return r, nil
}

// TestResumeNowReopensWhereItStarted: a "now" resume whose reader fails before sending
// anything is reopened where it first opened, so the events stored meanwhile are not lost.
func TestResumeNowReopensWhereItStarted(t *testing.T) {
	var fs firstNowFails
	e := newEnv(t, envOptions{wrap: func(s conversation.Store) conversation.Store {
		fs.Store = s
		return &fs
	}})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("gap", script{Tokens: 150, IntervalMs: 20}))
	const seen = 5
	cl.untilN(t, seen)
	got, end := dial(t, e.url("runId", "gap", "offset", "now"), "").untilClose()
	live := cl.untilTerminal()
	if end.code != websocket.StatusNormalClosure {
		t.Fatalf("resume closed %v, want 1000", end.err)
	}
	if len(got) > len(live) || strings.Join(raws(got), "\n") != strings.Join(raws(live[len(live)-len(got):]), "\n") {
		t.Fatalf("resume from now = %s, want a suffix of the live stream %s", summary(got), summary(live))
	}
	// The resume opened right after the socket got its 5th frame; its reader then failed a
	// second later (some 50 events), and the reopened one must start where it started.
	if missed := len(live) - len(got); missed > seen+15 {
		t.Errorf("resume from now missed the first %d of %d events: a gap after its reader failed", missed, len(live))
	}
}
