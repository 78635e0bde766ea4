package conversation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/wsgateway/wsgateway/auth"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/protocol"
)

var testSecret = []byte("a secret of thirty-two bytes or more, for tests")

// jwtTokens is conversation.Tokens over an HS256 Authenticator, as the gateway's main wires it.
type jwtTokens struct{ a *auth.Authenticator }

func (j jwtTokens) Identify(r *http.Request) (string, time.Time, error) {
	id, err := j.a.Identify(r)
	return id.Subject, id.Expires, err
}

func (j jwtTokens) Verify(token string) (string, time.Time, error) {
	id, err := j.a.VerifyIdentity(token)
	return id.Subject, id.Expires, err
}

func newTokenEnv(t testing.TB, tick time.Duration) *env {
	t.Helper()
	a, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, envOptions{tokens: jwtTokens{a}, heartbeat: heartbeat.Config{Interval: time.Hour, Tick: tick}})
}

// token returns an HS256 token of sub expiring at exp (whole seconds, as "exp" is).
func token(t testing.TB, sub string, exp time.Time) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": exp.Unix()}).SignedString(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dialToken opens a socket with a bearer token.
func dialToken(t testing.TB, u, tok string) *client {
	t.Helper()
	return dialWith(t, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
}

// dialWith opens a socket with opts.
func dialWith(t testing.TB, u string, opts *websocket.DialOptions) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	c, _, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		cancel()
		t.Fatalf("Dial(%s) = %v", u, err)
	}
	c.SetReadLimit(1 << 24)
	t.Cleanup(func() {
		c.CloseNow()
		cancel()
	})
	return &client{t: t, c: c, ctx: ctx, done: cancel}
}

func authFrame(tok string) []byte { return []byte(fmt.Sprintf(`{"type":"auth","token":%q}`, tok)) }

// TestTokenExpiryClosesSocket: a socket whose 3 s token expires is closed 4401 within a tick
// of the expiry; its running turn completes in the log, and a fresh token resumes it after
// the last offset received, with no gap and no duplicate.
func TestTokenExpiryClosesSocket(t *testing.T) {
	e := newTokenEnv(t, 100*time.Millisecond)
	exp := time.Now().Add(3 * time.Second).Truncate(time.Second) // "exp" has whole seconds
	cl := dialToken(t, e.url(), token(t, "p1", exp))
	const deltas = 40 // 40 × 150 ms: the turn outlives the token by seconds
	cl.send(runFrame("long", script{Tokens: deltas, IntervalMs: 150}))
	got, end := cl.untilClose()
	closedAt := time.Now()
	if end.code != conversation.StatusTokenExpired || end.reason != "token expired" {
		t.Fatalf("socket ended with %v, want close 4401 \"token expired\"", end.err)
	}
	if closedAt.Before(exp) || closedAt.After(exp.Add(time.Second)) {
		t.Errorf("closed at exp%+v, want within a second after exp", closedAt.Sub(exp).Round(time.Millisecond))
	}
	if len(got) < 3 || got[len(got)-1].Type.Terminal() {
		t.Fatalf("before the close: %s; want the turn under way", summary(got))
	}
	distinctOffsets(t, got)
	t.Logf("closed 4401 %v after exp, %d envelopes received", closedAt.Sub(exp).Round(time.Millisecond), len(got))

	// The expired token opens nothing any more.
	_, resp, err := websocket.Dial(context.Background(), e.url("runId", "long", "offset", got[len(got)-1].Offset),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token(t, "p1", exp)}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("resume with the expired token = %v, want 401", err)
	}

	// The turn goes on into its log; a fresh token resumes it.
	e.waitClosed(t, "long")
	rest, end := dialToken(t, e.url("runId", "long", "offset", got[len(got)-1].Offset), token(t, "p1", time.Now().Add(time.Hour))).untilClose()
	if end.code != websocket.StatusNormalClosure {
		t.Fatalf("resume ended with %v, want 1000", end.err)
	}
	all := append(got, rest...)
	distinctOffsets(t, all)
	if s := summary(all); s != tokenTurn(deltas) {
		t.Errorf("received then resumed: %s\nwant %s", s, tokenTurn(deltas))
	}
}

// TestAuthFrame: an auth frame with a fresh token of the socket's principal keeps the socket
// open past the first token's expiry and lets it start turns; a token of another subject and
// an invalid token are refused with a bare RUN_ERROR and change nothing.
func TestAuthFrame(t *testing.T) {
	e := newTokenEnv(t, 100*time.Millisecond)
	exp := time.Now().Add(3 * time.Second).Truncate(time.Second)
	cl := dialToken(t, e.url(), token(t, "p1", exp))

	cl.send(authFrame(token(t, "mallory", time.Now().Add(time.Hour))))
	if f := cl.next(5 * time.Second); f.Kind != protocol.FrameEvent || summary([]frame{f}) != "bare RUN_ERROR:forbidden" ||
		!strings.Contains(f.raw, conversation.MsgAuthOtherPrincipal) {
		t.Fatalf("answer to another subject's token: %s %v; want a bare RUN_ERROR forbidden", f.raw, f.err)
	}
	cl.send(authFrame(token(t, "p1", time.Now().Add(-time.Minute))))
	if f := cl.next(5 * time.Second); summary([]frame{f}) != "bare RUN_ERROR:unauthorized" || !strings.Contains(f.raw, "token is expired") {
		t.Fatalf("answer to an expired token: %s %v; want a bare RUN_ERROR unauthorized saying it expired", f.raw, f.err)
	}
	cl.send(authFrame("not-a-jwt"))
	if f := cl.next(5 * time.Second); summary([]frame{f}) != "bare RUN_ERROR:unauthorized" {
		t.Fatalf("answer to a malformed token: %s %v; want a bare RUN_ERROR unauthorized", f.raw, f.err)
	}

	fresh := time.Now().Add(time.Hour).Truncate(time.Second)
	cl.send(authFrame(token(t, "p1", fresh)))
	f := cl.next(5 * time.Second)
	var ack struct {
		Type, Name string
		Value      struct{ Exp int64 }
	}
	json.Unmarshal(f.Event, &ack)
	if f.Kind != protocol.FrameEvent || ack.Type != "CUSTOM" || ack.Name != conversation.AuthAcceptedName || ack.Value.Exp != fresh.Unix() {
		t.Fatalf("answer to a fresh token: %s %v; want a bare CUSTOM %s with exp %d", f.raw, f.err, conversation.AuthAcceptedName, fresh.Unix())
	}

	// Past the first token's expiry the socket is open and starts turns.
	time.Sleep(time.Until(exp.Add(1500 * time.Millisecond)))
	cl.send(runFrame("after", script{Tokens: 2}))
	if s := summary(cl.untilTerminal()); s != tokenTurn(2) {
		t.Errorf("turn after the first token's expiry: %s, want %s", s, tokenTurn(2))
	}
}

// TestAuthFrameOtherPrincipalExpires: a refused auth frame leaves the socket on its token,
// which then expires.
func TestAuthFrameOtherPrincipalExpires(t *testing.T) {
	e := newTokenEnv(t, 100*time.Millisecond)
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second)
	cl := dialToken(t, e.url(), token(t, "p1", exp))
	cl.send(authFrame(token(t, "p2", time.Now().Add(time.Hour))))
	got, end := cl.untilClose()
	if summary(got) != "bare RUN_ERROR:forbidden" || end.code != conversation.StatusTokenExpired {
		t.Fatalf("got %s then %v; want a bare RUN_ERROR forbidden then close 4401", summary(got), end.err)
	}
}

// TestExpiredTokenStartsNoTurn: a run frame read after the expiry, before the heartbeat's
// tick closes the socket, starts no turn: the socket closes 4401 at once.
func TestExpiredTokenStartsNoTurn(t *testing.T) {
	e := newTokenEnv(t, time.Hour) // the wheel never ticks in this test
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second)
	cl := dialToken(t, e.url(), token(t, "p1", exp))
	time.Sleep(time.Until(exp.Add(100 * time.Millisecond)))
	cl.send(runFrame("late", script{Tokens: 1}))
	got, end := cl.untilClose()
	if len(got) != 0 || end.code != conversation.StatusTokenExpired {
		t.Fatalf("got %s then %v; want nothing then close 4401", summary(got), end.err)
	}
	if n := e.metric(t, "wsgateway_turn_started_total", ""); n != 0 {
		t.Errorf("turns started = %v, want 0", n)
	}
}

// TestExpiredTokenAbortsNothingOnResume: an abort frame read on a resume socket after its
// token expired, before the heartbeat's tick closes the socket, aborts nothing: the socket
// closes 4401 and the run goes on to RUN_FINISHED.
func TestExpiredTokenAbortsNothingOnResume(t *testing.T) {
	e := newTokenEnv(t, time.Hour) // the wheel never ticks in this test
	owner := dialToken(t, e.url(), token(t, "p1", time.Now().Add(time.Hour)))
	const deltas = 30 // 30 × 150 ms: the run outlives the resume socket's token
	owner.send(runFrame("long", script{Tokens: deltas, IntervalMs: 150}))
	first := owner.next(5 * time.Second)
	if first.Offset == "" {
		t.Fatalf("first frame %s %v, want an event with an offset", first.raw, first.err)
	}
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second)
	rs := dialToken(t, e.url("runId", "long", "offset", first.Offset), token(t, "p1", exp))
	time.Sleep(time.Until(exp.Add(100 * time.Millisecond)))
	rs.send(abortFrame("long"))
	if _, end := rs.untilClose(); end.code != conversation.StatusTokenExpired {
		t.Fatalf("resume socket ended with %v, want close 4401", end.err)
	}
	if s := summary(append([]frame{first}, owner.untilTerminal()...)); s != tokenTurn(deltas) {
		t.Errorf("the run after an expired resume socket's abort: %s\nwant %s", s, tokenTurn(deltas))
	}
}
