package jetstream

import (
	"fmt"

	nats "github.com/nats-io/nats.go"
)

// Headers of an abort request.
const (
	hdrPrincipal = "Wsg-Principal"
	hdrRunID     = "Wsg-Run-Id"
	hdrOrigin    = "Wsg-Origin"
)

// OnAbort subscribes to the abort requests of every store sharing the stream, this one's
// included (RequestAbort), and calls f with the principal, runId and origin of each, from the
// connection's delivery goroutine: f must not block. The subscription lasts until Close.
func (s *Store) OnAbort(f func(principal, runID, origin string)) error {
	_, err := s.nc.Subscribe(s.cfg.AbortSubject, func(m *nats.Msg) {
		f(m.Header.Get(hdrPrincipal), m.Header.Get(hdrRunID), m.Header.Get(hdrOrigin))
	})
	if err != nil {
		return fmt.Errorf("jetstream: subscribe to aborts: %w", err)
	}
	return nil
}

// RequestAbort asks every store sharing the stream to abort the principal's run: the one
// whose process runs it stops it (OnAbort). A request for another principal's run, or for
// no run, changes nothing. origin is an opaque name of the client that asks (as
// Announcement.Origin, "" for none). It is sent once, at most once delivered, and does not wait.
func (s *Store) RequestAbort(principal, runID, origin string) error {
	m := nats.NewMsg(s.cfg.AbortSubject)
	m.Header.Set(hdrPrincipal, principal)
	m.Header.Set(hdrRunID, runID)
	if origin != "" {
		m.Header.Set(hdrOrigin, origin)
	}
	if err := s.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("jetstream: request abort: %w", err)
	}
	return nil
}
