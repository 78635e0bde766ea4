// Package jsstore adapts a *jetstream.Store to conversation.Store.
//
// New(store) returns the conversation.Store that cmd/wsgateway hands to conversation.New. The
// adapter translates jetstream's sentinel errors into conversation's (ErrForbidden,
// ErrUnknownRun, ErrInvalidOffset), keeping the original in the chain, and nothing else.
package jsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/turn"
)

// New adapts s.
func New(s *jetstream.Store) conversation.Store { return store{s} }

type store struct{ s *jetstream.Store }

func (a store) Create(ctx context.Context, principal, runID, threadID string) (turn.Log, error) {
	w, err := a.s.Create(ctx, principal, runID, threadID)
	if err != nil {
		return nil, translate(err)
	}
	return w, nil
}

func (a store) Read(ctx context.Context, principal, runID, after string) (conversation.Reader, error) {
	r, err := a.s.Read(ctx, principal, runID, after)
	if err != nil {
		return nil, translate(err)
	}
	return reader{r}, nil
}

type reader struct{ r *jetstream.Reader }

func (r reader) Next(ctx context.Context) (string, []byte, error) {
	e, err := r.r.Next(ctx)
	return e.Offset, e.Event, err
}

func (r reader) Close() error { return r.r.Close() }

// After returns the offset the reader reads after, "now" resolved (conversation's replay
// reopens a failed reader there).
func (r reader) After() string { return r.r.After() }

func translate(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrForbidden):
		return fmt.Errorf("%w: %w", conversation.ErrForbidden, err)
	case errors.Is(err, jetstream.ErrUnknownRun):
		return fmt.Errorf("%w: %w", conversation.ErrUnknownRun, err)
	case errors.Is(err, jetstream.ErrInvalidOffset):
		return fmt.Errorf("%w: %w", conversation.ErrInvalidOffset, err)
	}
	return err
}
