package threadstore

import (
	"encoding/json"
	"testing"

	"github.com/wsgateway/wsgateway/jetstream"
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
		{"the reaper's terminal", []string{marker, content, string(jetstream.ProducerLost)}, ThreadRunError, "producer_lost"},
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
