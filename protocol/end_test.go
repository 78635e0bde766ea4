package protocol

import "testing"

func TestEndOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event string
		want  End
		ok    bool
	}{
		{"finished", `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`, End{Kind: EndFinished}, true},
		{"finished with a success outcome", `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1","outcome":{"type":"success"}}`, End{Kind: EndFinished}, true},
		{"finished with an interrupt outcome",
			`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`,
			End{Kind: EndInterrupted}, true},
		{"an interrupt outcome's type escaped", `{"type":"RUN_FINISHED","outcome":{"type":"\u0069nterrupt"}}`, End{Kind: EndInterrupted}, true},
		{"an outcome that is not an object", `{"type":"RUN_FINISHED","outcome":"interrupt"}`, End{Kind: EndFinished}, true},
		{"an outcome whose type is not a string", `{"type":"RUN_FINISHED","outcome":{"type":["interrupt"]}}`, End{Kind: EndFinished}, true},
		{"an outcome keyed Type", `{"type":"RUN_FINISHED","outcome":{"Type":"interrupt"}}`, End{Kind: EndFinished}, true},
		{"a null outcome", `{"type":"RUN_FINISHED","outcome":null}`, End{Kind: EndFinished}, true},
		{"error with a code", `{"type":"RUN_ERROR","message":"producer lost","code":"producer_lost"}`, End{Kind: EndError, Code: "producer_lost"}, true},
		{"error without a code", `{"type":"RUN_ERROR","message":"boom"}`, End{Kind: EndError}, true},
		{"error whose code is not a string", `{"type":"RUN_ERROR","message":"boom","code":5}`, End{Kind: EndError}, true},
		{"the last of duplicate codes", `{"type":"RUN_ERROR","code":"a","message":"boom","code":"aborted"}`, End{Kind: EndError, Code: "aborted"}, true},
		{"whitespace", " {\n\t\"type\" : \"RUN_ERROR\" , \"code\" : \"agent_error\" }\n", End{Kind: EndError, Code: "agent_error"}, true},
		{"the last of duplicate types", `{"type":"RUN_FINISHED","type":"TEXT_MESSAGE_END"}`, End{}, false},
		{"a non-terminal", `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hi"}`, End{}, false},
		{"the run.accepted marker", `{"type":"CUSTOM","name":"run.accepted","value":{}}`, End{}, false},
		{"a subagent's error", `{"type":"SUBAGENT_ERROR","subagentRunId":"s1","message":"boom","code":"x"}`, End{}, false},
		{"a type keyed Type", `{"Type":"RUN_FINISHED"}`, End{}, false},
		{"a type that is not a string", `{"type":["RUN_ERROR"]}`, End{}, false},
		{"invalid JSON", `{"type":"RUN_FINISHED"`, End{}, false},
		{"two values", `{"type":"RUN_FINISHED"} {}`, End{}, false},
		{"an array", `[{"type":"RUN_FINISHED"}]`, End{}, false},
		{"a string", `"RUN_FINISHED"`, End{}, false},
		{"empty", ``, End{}, false},
	} {
		got, ok := EndOf([]byte(tc.event))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: EndOf(%s) = %+v, %v; want %+v, %v", tc.name, tc.event, got, ok, tc.want, tc.ok)
		}
	}
	if got, ok := EndOf(nil); ok || got != (End{}) {
		t.Errorf("EndOf(nil) = %+v, %v; want the zero End, false", got, ok)
	}
}

// TestEventEnd checks that a decoded event's End is EndOf of its encoding.
func TestEventEnd(t *testing.T) {
	for _, s := range []string{
		`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`,
		`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`,
		`{"type":"RUN_ERROR","message":"Request aborted","code":"aborted"}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`,
	} {
		ev := MustEvent(s)
		got, ok := ev.End()
		want, wantOK := EndOf([]byte(s))
		if got != want || ok != wantOK {
			t.Errorf("%s: End() = %+v, %v; EndOf = %+v, %v", s, got, ok, want, wantOK)
		}
	}
	if got, ok := RunAccepted().End(); ok {
		t.Errorf("the run.accepted marker: End() = %+v, true; want false", got)
	}
}
