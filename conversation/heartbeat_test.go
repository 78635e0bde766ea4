package conversation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/protocol"
)

// These tests run the heartbeat on real sockets with short durations; the timer logic itself
// is tested under testing/synctest in package heartbeat.

func TestPingsSent(t *testing.T) {
	e := newEnv(t, envOptions{memory: true, heartbeat: heartbeat.Config{Interval: 50 * time.Millisecond, PongTimeout: 2 * time.Second, IdleTimeout: time.Minute}})
	cl := dial(t, e.url(), "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pings := 0
	for pings < 3 {
		_, data, err := cl.c.Read(ctx)
		if err != nil {
			t.Fatalf("Read() = %v after %d pings", err, pings)
		}
		f, err := protocol.DecodeServerFrame(data)
		if err != nil || f.Kind != protocol.FramePing {
			t.Fatalf("frame %s, want {\"type\":\"ping\"}", data)
		}
		pings++
	}
	// The client answered the protocol pings (coder/websocket does while reading): still open.
	cl.send(runFrame("pinged", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("turn = %s, want %s", got, tokenTurn(1))
	}
}

func TestIdleClose(t *testing.T) {
	hb := heartbeat.Config{Interval: time.Hour, IdleTimeout: 300 * time.Millisecond}
	e := newEnv(t, envOptions{memory: true, heartbeat: hb})

	quiet := dial(t, e.url(), "")
	start := time.Now()
	_, end := quiet.untilClose()
	if end.code != websocket.StatusNormalClosure || end.reason != "idle" {
		t.Errorf("quiet socket closed %v, want 1000 idle", end.err)
	}
	if d := time.Since(start); d < hb.IdleTimeout {
		t.Errorf("quiet socket closed after %v, before the idle timeout %v", d, hb.IdleTimeout)
	}

	// A turn that produces for longer than the idle timeout keeps its socket open, though the
	// client sends nothing after its run frame.
	busy := dial(t, e.url(), "")
	busy.send(runFrame("long", script{Tokens: 12, IntervalMs: 100}))
	if got := summary(busy.untilTerminal()); got != tokenTurn(12) {
		t.Fatalf("long turn = %s, want %s", got, tokenTurn(12))
	}
	// Once it ended, the socket idles out.
	_, end = busy.untilClose()
	if end.code != websocket.StatusNormalClosure || end.reason != "idle" {
		t.Errorf("socket after its turn closed %v, want 1000 idle", end.err)
	}

	// A resume socket tailing a long turn does not idle out either.
	conv := dial(t, e.url(), "")
	conv.send(runFrame("tailed", script{Tokens: 10, IntervalMs: 80}))
	conv.untilN(t, 2)
	got, end := e.resume(t, "tailed", "-1")
	if summary(got) != tokenTurn(10) || end.code != websocket.StatusNormalClosure || end.reason != "" {
		t.Errorf("tailing resume = %s, closed %v; want the whole turn then 1000", summary(got), end.err)
	}
}

func TestDeadPeer(t *testing.T) {
	hb := heartbeat.Config{Interval: 100 * time.Millisecond, PongTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute}
	e := newEnv(t, envOptions{memory: true, heartbeat: hb})
	// A client that never reads never answers protocol pings.
	cl := dial(t, e.url(), "")
	e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation", 1)
	e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation", 0)
	// The server dropped the connection without a close handshake.
	_, end := cl.untilClose()
	if end.code != -1 || errors.Is(end.err, context.DeadlineExceeded) {
		t.Errorf("silent client's socket ended %v, want a dropped connection", end.err)
	}
}
