package agent

import (
	"net/http"
	"time"
)

// Upstream configures how an agent reaches its HTTP upstream (the agui and openai agents): the
// headers it sends and forwards, its timeouts and the largest event it takes. Zero fields mean
// the defaults given.
type Upstream struct {
	// Header is sent with every request (e.g. Authorization); the agent sets Content-Type and
	// Accept itself.
	Header http.Header
	// ForwardHeaders names headers of the client's handshake (ClientHeader of Run's context)
	// copied onto the request, e.g. "Authorization" or "Cookie". Header wins over a forwarded
	// header of the same name.
	ForwardHeaders []string

	ConnectTimeout    time.Duration // dial and TLS handshake (10s)
	FirstEventTimeout time.Duration // request sent → first event (60s)
	GapTimeout        time.Duration // longest silence of the stream after the first event (60s)
	TurnTimeout       time.Duration // the whole request (30m)
	MaxEventBytes     int           // one server-sent event's data (1 MiB)

	// Client, if set, sends the requests (tests); ConnectTimeout is then its business.
	Client *http.Client
}
