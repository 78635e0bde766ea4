package conversation

import "testing"

// TestAbortOutcomeOf checks the outcome an abort request answers for the last event of a
// run's log.
func TestAbortOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		last, want string
	}{
		{`{"type":"RUN_ERROR","message":"Request aborted","code":"aborted"}`, AbortOutcomeAborted},
		{`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`, AbortOutcomeFinished},
		{`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`, AbortOutcomeFinished},
		{`{"type":"RUN_ERROR","message":"producer lost","code":"producer_lost"}`, AbortOutcomeError},
		{`{"type":"RUN_ERROR","message":"shutting down","code":"shutdown"}`, AbortOutcomeError},
		{`{"type":"RUN_ERROR","message":"boom"}`, AbortOutcomeError},
		{`{"type":"CUSTOM","name":"run.accepted","value":{}}`, AbortOutcomeError},
		{`{"type":"RUN_FINISHED"`, AbortOutcomeError},
		{``, AbortOutcomeError},
	} {
		if got := outcomeOf([]byte(tc.last)); got != tc.want {
			t.Errorf("outcomeOf(%s) = %q, want %q", tc.last, got, tc.want)
		}
	}
}
