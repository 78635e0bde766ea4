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
	hdrInterrupt = "Wsg-Interrupt"
)

// OnAbort subscribes to the abort requests of every store sharing the stream, this one's
// included (RequestAbort, RequestInterrupt), and calls f with the principal, runId and
// origin of each, and whether it is an interrupt, from the connection's delivery goroutine: f
// must not block. The subscription lasts until Close.
func (s *Store) OnAbort(f func(principal, runID, origin string, interrupt bool)) error {
	_, err := s.nc.Subscribe(s.cfg.AbortSubject, func(m *nats.Msg) {
		f(m.Header.Get(hdrPrincipal), m.Header.Get(hdrRunID), m.Header.Get(hdrOrigin), m.Header.Get(hdrInterrupt) != "")
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
	return s.requestStop(principal, runID, origin, false)
}

// RequestInterrupt asks, as RequestAbort does, that the principal's run be stopped because a
// newer run of its thread takes its place (its RUN_ERROR's code is interrupted).
func (s *Store) RequestInterrupt(principal, runID string) error {
	return s.requestStop(principal, runID, "", true)
}

func (s *Store) requestStop(principal, runID, origin string, interrupt bool) error {
	m := nats.NewMsg(s.cfg.AbortSubject)
	m.Header.Set(hdrPrincipal, principal)
	m.Header.Set(hdrRunID, runID)
	if origin != "" {
		m.Header.Set(hdrOrigin, origin)
	}
	if interrupt {
		m.Header.Set(hdrInterrupt, "1")
	}
	if err := s.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("jetstream: request abort: %w", err)
	}
	return nil
}
