package jetstream

import (
	"encoding/json"
	"testing"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TestThreadRunEndState checks the state and code a thread's run gets from its log: its last
// terminal's, producer_lost when it holds none.
func TestThreadRunEndState(t *testing.T) {
	const (
		marker      = `{"type":"CUSTOM","name":"run.accepted","value":{}}`
		content     = `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hi"}`
		finished    = `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`
		interrupted = `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`
		aborted     = `{"type":"RUN_ERROR","message":"Request aborted","code":"aborted"}`
		noCode      = `{"type":"RUN_ERROR","message":"boom"}`
	)
	for _, tc := range []struct {
		name        string
		events      []string
		state, code string
	}{
		{"finished", []string{marker, content, finished}, ThreadRunFinished, ""},
		{"interrupted", []string{marker, interrupted}, ThreadRunInterrupted, ""},
		{"error with a code", []string{marker, content, aborted}, ThreadRunError, "aborted"},
		{"error without a code", []string{marker, noCode}, ThreadRunError, ""},
		{"the reaper's terminal", []string{marker, content, string(producerLost)}, ThreadRunError, "producer_lost"},
		{"an agent loop's last run", []string{marker, finished, interrupted}, ThreadRunInterrupted, ""},
		{"the last terminal, not the last event", []string{marker, aborted, content, `{"type":`}, ThreadRunError, "aborted"},
		{"no terminal", []string{marker, content}, ThreadRunError, "producer_lost"},
		{"nothing", nil, ThreadRunError, "producer_lost"},
	} {
		events := make([]json.RawMessage, len(tc.events))
		for i, e := range tc.events {
			events[i] = json.RawMessage(e)
		}
		if state, code := endState(events); state != tc.state || code != tc.code {
			t.Errorf("%s: endState = %q, %q; want %q, %q", tc.name, state, code, tc.state, tc.code)
		}
	}
}

// TestReapEndsWithTerminal checks which last batches of a log the reaper closes without a
// terminal of its own.
func TestReapEndsWithTerminal(t *testing.T) {
	batch := func(events ...string) *natsjs.RawStreamMsg {
		evs := make([][]byte, len(events))
		for i, e := range events {
			evs[i] = []byte(e)
		}
		return &natsjs.RawStreamMsg{Header: nats.Header{}, Data: encodeBatch(nil, evs)}
	}
	closeRecord := &natsjs.RawStreamMsg{Header: nats.Header{hdrCtl: {ctlClose}}}
	for _, tc := range []struct {
		name string
		m    *natsjs.RawStreamMsg
		want bool
	}{
		{"RUN_FINISHED", batch(`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`), true},
		{"RUN_ERROR", batch(`{"type":"RUN_ERROR","message":"boom","code":"agent_error"}`), true},
		{"the reaper's terminal", batch(string(producerLost)), true},
		{"a terminal before the last event", batch(`{"type":"RUN_ERROR","message":"boom"}`, `{"type":"TEXT_MESSAGE_END","messageId":"m1"}`), false},
		{"the marker", batch(`{"type":"CUSTOM","name":"run.accepted","value":{}}`), false},
		{"an undecodable event", batch(`{"type":"RUN_FINISHED"`), false},
		{"an empty batch", batch(), false},
		{"a close record", closeRecord, false},
	} {
		if got := endsWithTerminal(tc.m); got != tc.want {
			t.Errorf("%s: endsWithTerminal = %v, want %v", tc.name, got, tc.want)
		}
	}
}
