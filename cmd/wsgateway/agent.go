package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/aguihttp"
	"github.com/wsgateway/wsgateway/agent/openai"
	"github.com/wsgateway/wsgateway/turn"
)

// newUpstreamAgent returns the agui or openai agent of cfg. One upstream event may be as large
// as --max-event-bytes, the turn's own bound on an event.
func newUpstreamAgent(cfg serveConfig) (turn.Agent, error) {
	up := agent.Upstream{
		Header:            cfg.agentHeader,
		ForwardHeaders:    cfg.agentForward,
		ConnectTimeout:    cfg.agentConnectTimeout,
		FirstEventTimeout: cfg.agentFirstEvent,
		GapTimeout:        cfg.agentGapTimeout,
		TurnTimeout:       cfg.agentTurnTimeout,
		MaxEventBytes:     int(cfg.maxEventBytes),
	}
	var a turn.Agent
	var err error
	switch cfg.agent {
	case agentAGUI:
		a, err = aguihttp.New(aguihttp.Config{URL: cfg.agentURL, Upstream: up})
	case agentOpenAI:
		a, err = openai.New(openai.Config{BaseURL: cfg.agentURL, Model: cfg.agentModel, APIKey: cfg.agentAPIKey, Upstream: up})
	default:
		return nil, fmt.Errorf("%w: unknown agent %q", errUsage, cfg.agent)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return a, nil
}

// clientHeaders returns the conversation.Config.TurnContext that hands the agents the headers
// of the client's request that --agent-forward-headers names, nil when it names none.
func clientHeaders(names []string) func(*http.Request) context.Context {
	if len(names) == 0 {
		return nil
	}
	return func(r *http.Request) context.Context {
		h := make(http.Header, len(names))
		for _, name := range names {
			if v := r.Header.Values(name); len(v) > 0 {
				h[name] = slices.Clone(v)
			}
		}
		return agent.WithClientHeader(context.Background(), h)
	}
}
