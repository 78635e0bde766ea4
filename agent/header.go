package agent

import (
	"context"
	"net/http"
)

type headerKey struct{}

// WithClientHeader returns ctx carrying the HTTP headers of the client's handshake (the
// conversation socket's request), for agents that forward chosen ones upstream (the agui and
// openai agents' ForwardHeaders). The caller must not modify h afterwards.
func WithClientHeader(ctx context.Context, h http.Header) context.Context {
	return context.WithValue(ctx, headerKey{}, h)
}

// ClientHeader returns the client's handshake headers carried by ctx, nil when none.
func ClientHeader(ctx context.Context) http.Header {
	h, _ := ctx.Value(headerKey{}).(http.Header)
	return h
}

type replayKey struct{}

// WithReplay returns ctx telling the agent that its run is a replay of one whose producer
// died, whose first n events are stored already: the gateway drops them (matching them with
// the log), so an agent that paces its events may emit those n at once.
func WithReplay(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, replayKey{}, n)
}

// Replayed returns the n of WithReplay, 0 when ctx is not a replay's.
func Replayed(ctx context.Context) int {
	n, _ := ctx.Value(replayKey{}).(int)
	return n
}
