package conversation_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// threadStall is how long NATS stalls in TestThreadRunAcrossNATSStall: longer than a thread
// write waits (10 s): 20 s, as long as the outages the gateway is built to ride out.
const threadStall = 20 * time.Second

// stallOnAccept stalls NATS (refuses and cuts the gateway's connections for threadStall) as
// the first run is being written into its thread.
type stallOnAccept struct {
	threads
	stall func()
	once  *sync.Once
}

func (s stallOnAccept) AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, ahead conversation.ThreadAhead, o conversation.Overlap) (conversation.Thread, error) {
	s.once.Do(s.stall)
	return s.threads.AcceptRun(ctx, principal, threadID, runID, input, ahead, o)
}

// TestThreadRunAcrossNATSStall: NATS stalls while a turn's run is being written into its
// thread, long enough for that write to fail; once NATS is back the turn completes, and its
// thread, hydrated from another gateway, holds the run with its final transcript.
func TestThreadRunAcrossNATSStall(t *testing.T) {
	host := newEnv(t, envOptions{}) // holds the NATS server, and is the other gateway
	var down atomic.Bool
	px := tcpproxy.Start(t, strings.TrimPrefix(host.store.ClientURL(), "nats://"), func([]byte) bool { return down.Load() })
	stall := func() {
		down.Store(true)
		px.Cut()
		time.AfterFunc(threadStall, func() { down.Store(false) })
	}
	// The lease outlives the stall: the host's reaper would otherwise end the turn with
	// producer_lost, as it must for a gateway that died.
	gw := newEnv(t, envOptions{natsURL: "nats://" + px.Addr(), leaseTTL: 2 * time.Minute,
		wrapThreads: func(th conversation.Threads) conversation.Threads {
			return stallOnAccept{threads: th, stall: stall, once: &sync.Once{}}
		}})
	frames := gw.open(t, "/api/chat", "POST", threadFrame("T", "r1", script{Tokens: 3}, "u1", "hello"), nil).all()
	if last := frames[len(frames)-1].raw; !strings.Contains(string(last), "RUN_FINISHED") {
		t.Fatalf("the turn ended with %s, want RUN_FINISHED", last)
	}
	want := "u1 user: hello | m-r1-1 assistant: t1 t2 t3  | "
	deadline := time.Now().Add(time.Minute)
	for {
		h := host.hydrate(t, "/api/chat", "", "threadId", "T")
		if h.ActiveRun == nil {
			if got := h.summary(); got != want {
				t.Fatalf("hydrate after the stall = %s\nwant messages %s", h.raw, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run is still active a minute after its turn ended: %s", h.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
