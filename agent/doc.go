// Package agent documents the producers of AG-UI events that the gateway runs for a turn; the
// producers themselves live in its subpackages: demo (the built-in deterministic agent),
// aguihttp (an AG-UI server over the standard HTTP transport) and openai (an OpenAI-compatible
// Chat Completions server).
//
// WithClientHeader and ClientHeader carry the HTTP headers of the client's handshake in the
// context an agent's Run is given, for the agents that forward chosen ones upstream.
//
// The contract is declared by its consumer, package turn:
//
//		Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error
//
//	  - in is the validated run frame; Run must not modify it.
//	  - emit takes one AG-UI event as JSON, from one goroutine at a time. The turn parses,
//	    checks, stores and delivers it; emit does not keep the slice after it returns. When
//	    emit returns an error the agent stops and returns (that error, wrapped).
//	  - Run returns when its stream ends. An agent loop may emit several
//	    RUN_STARTED…RUN_FINISHED pairs before it returns; the turn ends when Run returns, not
//	    at the first RUN_FINISHED. A non-nil error is reported as RUN_ERROR agent_error.
//	  - Run returns promptly once ctx is cancelled (an abort, a resubmit, a shutdown), without
//	    emitting anything more.
//
// Agents know nothing of sockets or NATS.
package agent
