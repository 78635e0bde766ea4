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
