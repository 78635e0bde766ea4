package conversation

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/protocol"
)

// Tokens verifies the tokens of principals that expire (Config.Tokens).
type Tokens interface {
	// Identify returns the principal of the request's token and the instant it expires.
	Identify(r *http.Request) (principal string, expires time.Time, err error)
	// Verify returns the principal of a token sent in an auth frame and the instant it
	// expires.
	Verify(token string) (principal string, expires time.Time, err error)
}

// StatusTokenExpired closes a conversation socket whose token expired without an auth frame
// bringing a fresh one (PROTOCOL.md section 2). Its turns go on into their logs; the client
// resumes them with a fresh token.
const StatusTokenExpired websocket.StatusCode = 4401

// Answers to auth frames: a bare RUN_ERROR with code CodeUnauthorized (an invalid token, or
// no token authentication) or CodeForbidden (another principal's token), or the bare event
// AuthAccepted.
const (
	CodeUnauthorized = "unauthorized"

	// MsgAuthOtherPrincipal is the message of the refusal of a token of another subject.
	MsgAuthOtherPrincipal = "auth: the token's subject is not the socket's principal (a socket never changes principal)"
	// MsgAuthOff is the message of the refusal of an auth frame by a gateway without token
	// authentication.
	MsgAuthOff = "auth: this gateway does not authenticate with tokens"
	// AuthAcceptedName is the CUSTOM event name of the answer to an accepted auth frame:
	// {"type":"CUSTOM","name":"auth.accepted","value":{"exp":<unix seconds>}}.
	AuthAcceptedName = "auth.accepted"
)

// identify returns the principal of r and when it expires: the zero time for a principal
// that does not expire (Config.Principal without Config.Tokens).
func (s *Server) identify(r *http.Request) (string, time.Time, error) {
	if s.cfg.Tokens != nil {
		return s.cfg.Tokens.Identify(r)
	}
	p, err := s.cfg.Principal(r)
	return p, time.Time{}, err
}

// principalOf returns the Config.Principal of tokens.
func principalOf(tokens Tokens) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		p, _, err := tokens.Identify(r)
		return p, err
	}
}

// tokenExpired reports whether the socket's token expired; if so, it closes the socket 4401
// at once (the heartbeat wheel would within a tick, on a conversation socket), so that a frame
// read after the expiry starts or stops nothing.
func (c *conn) tokenExpired() bool {
	d := c.hb.Deadline()
	if c.resume {
		d = c.expires
	}
	if d.IsZero() || time.Now().Before(d) {
		return false
	}
	c.requestClose(StatusTokenExpired, "token expired", true)
	return true
}

// expireTokenLocked closes the socket for its expired token, after the frames already
// queued. The heartbeat wheel calls it (through Expire) with c.mu held.
func (c *conn) expireTokenLocked() {
	c.requestCloseLocked(StatusTokenExpired, "token expired", true)
}

// reauth handles an auth frame: a valid token of the socket's principal moves the socket's
// expiry to the token's; any other is refused and leaves the socket as it was.
func (c *conn) reauth(token string) {
	tokens := c.srv.cfg.Tokens
	if tokens == nil {
		c.Deliver("", protocol.AppendRunError(nil, MsgAuthOff, CodeUnauthorized), time.Time{})
		return
	}
	p, exp, err := tokens.Verify(token)
	switch {
	case err != nil:
		// The error says why, never with the token.
		c.logAttrs(slog.LevelDebug, "auth frame refused", slog.String(keyErr, err.Error()))
		c.Deliver("", protocol.AppendRunError(nil, err.Error(), CodeUnauthorized), time.Time{})
	case p != c.principal:
		c.logAttrs(slog.LevelInfo, "auth frame refused: another principal's token")
		c.Deliver("", protocol.AppendRunError(nil, MsgAuthOtherPrincipal, CodeForbidden), time.Time{})
	default:
		c.hb.SetDeadline(exp)
		c.Deliver("", appendAuthAccepted(nil, exp), time.Time{})
	}
}

// appendAuthAccepted appends the answer to an accepted auth frame.
func appendAuthAccepted(dst []byte, exp time.Time) []byte {
	dst = append(dst, `{"type":"CUSTOM","name":"`+AuthAcceptedName+`","value":{"exp":`...)
	dst = strconv.AppendInt(dst, exp.Unix(), 10)
	return append(dst, `}}`...)
}
