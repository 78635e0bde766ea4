package thread_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// run returns a run of the reference: its events are the stored log (the
// run.accepted marker first), one JSON event per argument.
func run(id string, before []refOp, events ...string) refRun {
	r := refRun{RunID: id, ThreadID: "t", Before: before,
		Events: []json.RawMessage{json.RawMessage(`{"type":"CUSTOM","name":"run.accepted","value":{}}`)}}
	for _, e := range events {
		r.Events = append(r.Events, json.RawMessage(e))
	}
	return r
}

func user(id, text string) refOp { return refOp{Op: "user", ID: id, Content: text} }

func approve(id string, ok bool) refOp { return refOp{Op: "approve", ApprovalID: id, Approved: &ok} }

const (
	started  = `{"type":"RUN_STARTED","threadId":"t","runId":"%s"}`
	finished = `{"type":"RUN_FINISHED","threadId":"t","runId":"%s"}`
)

func startedRun(id string) string  { return strings.Replace(started, "%s", id, 1) }
func finishedRun(id string) string { return strings.Replace(finished, "%s", id, 1) }

// approvalRun asks for approval of get_weather's call c1.
func approvalRun() refRun {
	return run("r1", []refOp{user("u1", "weather?")},
		startedRun("r1"),
		`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Let me check."}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`,
		`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"get_weather","parentMessageId":"m1"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"city\":"}`,
		`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"\"Paris\"}"}`,
		`{"type":"TOOL_CALL_END","toolCallId":"c1"}`,
		`{"type":"RUN_FINISHED","threadId":"t","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required","toolCallId":"c1","metadata":{"kind":"approval","toolName":"get_weather","input":{"city":"Paris"}}}]}}`)
}

func answerRun(approved bool) refRun {
	reply := `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"Not checked."}`
	result := `{"type":"TOOL_CALL_RESULT","messageId":"tr1","toolCallId":"c1","content":"{\"error\":\"denied\"}","state":"output-error"}`
	if approved {
		reply = `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"It is 20 degrees."}`
		result = `{"type":"TOOL_CALL_RESULT","messageId":"tr1","toolCallId":"c1","content":"{\"temp\":20}"}`
	}
	return run("r2", []refOp{approve("i1", approved)},
		startedRun("r2"), result,
		`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`, reply,
		`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`, finishedRun("r2"))
}

// threads are conversations of several runs, each as ChatClient drives its
// processor between and during runs.
func threads() []refThread {
	hello := run("r1", []refOp{user("u1", "hello")}, startedRun("r1"),
		`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hi "}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"there."}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))
	return []refThread{
		{ID: "tool call and result", Runs: []refRun{run("r1", []refOp{user("u1", "weather in Paris?")},
			startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Checking."}`,
			`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"get_weather","parentMessageId":"m1"}`,
			`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"city\":\"Paris\"}"}`,
			`{"type":"TOOL_CALL_END","toolCallId":"c1"}`,
			`{"type":"TOOL_CALL_RESULT","messageId":"tr1","toolCallId":"c1","content":"{\"temp\":20}"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"It is 20 degrees."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "approval interrupt", Runs: []refRun{approvalRun()}},
		{ID: "approval approved", Runs: []refRun{approvalRun(), answerRun(true)}},
		{ID: "approval denied", Runs: []refRun{approvalRun(), answerRun(false)}},
		{ID: "client tool result", Runs: []refRun{
			run("r1", []refOp{user("u1", "where am I?")}, startedRun("r1"),
				`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"get_location"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{}"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"c1"}`,
				`{"type":"RUN_FINISHED","threadId":"t","runId":"r1","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"client_tool_input","toolCallId":"c1","metadata":{"kind":"client_tool","toolName":"get_location"}}]}}`),
			run("r2", []refOp{{Op: "toolResult", ToolCallID: "c1", InterruptID: "i1", Output: json.RawMessage(`{"city":"Lyon"}`)}}, startedRun("r2"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"You are in Lyon."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`, finishedRun("r2"))}},
		{ID: "error mid-text", Runs: []refRun{hello, run("r2", []refOp{user("u2", "more")}, startedRun("r2"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"Half a"}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`,
			`{"type":"RUN_ERROR","message":"agent failed","code":"agent_error"}`)}},
		{ID: "error before any text", Runs: []refRun{run("r1", []refOp{user("u1", "hi")}, startedRun("r1"),
			`{"type":"RUN_ERROR","message":"agent failed","code":"agent_error"}`)}},
		{ID: "reasoning before text, TEXT_MESSAGE_START first", Runs: []refRun{run("r1", []refOp{user("u1", "think")}, startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"REASONING_START","messageId":"rs1"}`,
			`{"type":"REASONING_MESSAGE_START","messageId":"rs1","role":"reasoning"}`,
			`{"type":"REASONING_MESSAGE_CONTENT","messageId":"rs1","delta":"Pondering"}`,
			`{"type":"REASONING_MESSAGE_END","messageId":"rs1"}`,
			`{"type":"REASONING_END","messageId":"rs1"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Done."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "reasoning before TEXT_MESSAGE_START", Runs: []refRun{run("r1", []refOp{user("u1", "think")}, startedRun("r1"),
			`{"type":"REASONING_START","messageId":"rs1"}`,
			`{"type":"REASONING_MESSAGE_START","messageId":"rs1","role":"reasoning"}`,
			`{"type":"REASONING_MESSAGE_CONTENT","messageId":"rs1","delta":"Pondering"}`,
			`{"type":"REASONING_MESSAGE_END","messageId":"rs1"}`,
			`{"type":"REASONING_END","messageId":"rs1"}`,
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant","metadata":{"tanstack":{"createdAt":"2026-01-02T03:04:05.000Z"}}}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Done."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "whitespace-only reply dropped", Runs: []refRun{run("r1", []refOp{user("u1", "say nothing")}, startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" \n"}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "regenerate", Runs: []refRun{hello,
			run("r2", []refOp{user("u2", "again")}, startedRun("r2"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"First answer."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`, finishedRun("r2")),
			run("r3", []refOp{{Op: "truncate", ID: "u2"}}, startedRun("r3"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m3","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m3","delta":"Second answer."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m3"}`, finishedRun("r3"))}},
		{ID: "messages snapshot", Runs: []refRun{hello,
			run("r2", []refOp{user("u2", "weather?")}, startedRun("r2"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
				`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"get_weather","parentMessageId":"m2"}`,
				`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"city\":\"Paris\"}"}`,
				`{"type":"TOOL_CALL_END","toolCallId":"c1"}`,
				`{"type":"TOOL_CALL_RESULT","messageId":"tr1","toolCallId":"c1","content":"{\"temp\":20}"}`,
				`{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"u1","role":"user","content":"hello"},{"id":"m1","role":"assistant","content":"Hi there."},{"id":"u2","role":"user","content":[{"type":"text","text":"weather?"}]},{"id":"rs1","role":"reasoning","content":"Looking it up"},{"id":"m2","role":"assistant","content":"","toolCalls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"id":"tr1","role":"tool","toolCallId":"c1","content":"{\"temp\":20}"}]}`,
				`{"type":"TEXT_MESSAGE_START","messageId":"m3","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m3","delta":"20 degrees."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m3"}`, finishedRun("r2")),
			run("r3", []refOp{user("u3", "thanks")}, startedRun("r3"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m4","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m4","delta":"You are welcome."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m4"}`, finishedRun("r3"))}},
		{ID: "legacy approval-requested event", Runs: []refRun{run("r1", []refOp{user("u1", "delete it")}, startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"delete","parentMessageId":"m1"}`,
			`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{}"}`,
			`{"type":"TOOL_CALL_END","toolCallId":"c1"}`,
			`{"type":"CUSTOM","name":"approval-requested","value":{"toolCallId":"c1","toolName":"delete","input":{},"approval":{"id":"a1","needsApproval":true}}}`,
			finishedRun("r1"))}},
		{ID: "input on TOOL_CALL_END, fields in metadata.tanstack", Runs: []refRun{run("r1", []refOp{user("u1", "search")}, startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Searching."}`,
			`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"web_search","metadata":{"tanstack":{"parentMessageId":"m1"}}}`,
			`{"type":"TOOL_CALL_END","toolCallId":"c1","metadata":{"tanstack":{"input":{"query":"go","n":3}}}}`,
			`{"type":"TOOL_CALL_START","toolCallId":"c2","toolCallName":"web_search","parentMessageId":"m1"}`,
			`{"type":"TOOL_CALL_END","toolCallId":"c2","input":{"query":"js"}}`,
			`{"type":"TOOL_CALL_RESULT","messageId":"t1","toolCallId":"c1","content":"not json"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Found."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "steps and signatures", Runs: []refRun{run("r1", []refOp{user("u1", "think hard")}, startedRun("r1"),
			`{"type":"STEP_STARTED","stepName":"plan"}`,
			`{"type":"REASONING_MESSAGE_START","messageId":"rs1","role":"reasoning"}`,
			`{"type":"REASONING_MESSAGE_CONTENT","messageId":"rs1","delta":"first"}`,
			`{"type":"REASONING_MESSAGE_END","messageId":"rs1"}`,
			`{"type":"STEP_FINISHED","stepName":"plan","signature":"sig1"}`,
			`{"type":"STEP_STARTED","stepName":"check"}`,
			`{"type":"REASONING_MESSAGE_START","messageId":"rs2","role":"reasoning"}`,
			`{"type":"REASONING_MESSAGE_CONTENT","messageId":"rs2","delta":"second"}`,
			`{"type":"REASONING_ENCRYPTED_VALUE","subtype":"message","entityId":"rs2","encryptedValue":"enc2"}`,
			`{"type":"REASONING_MESSAGE_END","messageId":"rs2"}`,
			`{"type":"STEP_FINISHED","stepName":"check"}`,
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Answer."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "agent loop, finishReason tool_calls", Runs: []refRun{run("r1", []refOp{user("u1", "loop")},
			startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"f","parentMessageId":"m1"}`,
			`{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"a\":1"}`,
			`{"type":"RUN_FINISHED","threadId":"t","runId":"r1","finishReason":"tool_calls"}`,
			startedRun("r1b"),
			`{"type":"TOOL_CALL_RESULT","messageId":"t1","toolCallId":"c1","content":"1"}`,
			`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"  "}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`,
			finishedRun("r1b"))}},
		{ID: "user message metadata", Runs: []refRun{run("r1", []refOp{{Op: "user", ID: "u1", Content: "hi", Metadata: json.RawMessage(`{"source":"voice","lang":"fr"}`)}}, startedRun("r1"),
			`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
			`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Salut."}`,
			`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, finishedRun("r1"))}},
		{ID: "three turns", Runs: []refRun{hello,
			run("r2", []refOp{user("u2", "and?")}, startedRun("r2"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m2","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m2","delta":"And so on."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m2"}`, finishedRun("r2")),
			run("r3", []refOp{user("u3", "bye")}, startedRun("r3"),
				`{"type":"TEXT_MESSAGE_START","messageId":"m3","role":"assistant"}`,
				`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m3","delta":"Bye."}`,
				`{"type":"TEXT_MESSAGE_END","messageId":"m3"}`, finishedRun("r3"))}},
	}
}

// newOnly keeps the messages of input whose ids the previous input did not
// have: what a client with history.pageSize posts.
func newOnly(t *testing.T, input, previous json.RawMessage) json.RawMessage {
	t.Helper()
	var in, prev map[string]json.RawMessage
	if err := json.Unmarshal(input, &in); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	if previous != nil {
		if err := json.Unmarshal(previous, &prev); err != nil {
			t.Fatal(err)
		}
		var msgs []struct{ ID string }
		_ = json.Unmarshal(prev["messages"], &msgs)
		for _, m := range msgs {
			seen[m.ID] = true
		}
	}
	var msgs []json.RawMessage
	_ = json.Unmarshal(in["messages"], &msgs)
	var kept []json.RawMessage
	for _, m := range msgs {
		var id struct{ ID string }
		_ = json.Unmarshal(m, &id)
		if !seen[id.ID] {
			kept = append(kept, m)
		}
	}
	in["messages"] = mustJSON(t, kept)
	return mustJSON(t, in)
}

// TestThreads builds conversations run by run, Accept then Finish with the
// RunAgentInput the client posted, and requires the messages ChatClient's
// processor holds after the last run (normalised as in TestDifferential).
// "pageSize" posts only messages the previous run's input did not have.
func TestThreads(t *testing.T) {
	ths := threads()
	results := runReference(t, ths)
	for i, th := range ths {
		modes := []string{"whole", "pageSize"}
		if th.ID == "regenerate" {
			// A regenerate posts the list up to the message it answers again.
			modes = modes[:1]
		}
		for _, mode := range modes {
			t.Run(th.ID+"/"+mode, func(t *testing.T) {
				var tr thread.Transcript
				for j, r := range th.Runs {
					input := results[i].Inputs[j]
					if mode == "pageSize" {
						var prev json.RawMessage
						if j > 0 {
							prev = results[i].Inputs[j-1]
						}
						input = newOnly(t, input, prev)
					}
					if err := tr.Accept(r.RunID, input); err != nil {
						t.Fatalf("Accept(%s): %v", r.RunID, err)
					}
					if err := tr.Finish(r.RunID, r.Events); err != nil {
						t.Fatalf("Finish(%s): %v", r.RunID, err)
					}
					// The store keeps the transcript as JSON between runs.
					var again thread.Transcript
					if err := json.Unmarshal(mustJSON(t, tr), &again); err != nil {
						t.Fatalf("unmarshal the transcript: %v", err)
					}
					tr = again
				}
				got := normalise(t, mustJSON(t, tr.Messages), isServerID)
				want := normalise(t, results[i].Messages, isClientID)
				if got != want {
					t.Errorf("the transcripts differ %s\nserver: %s\nclient: %s", firstDiff(got, want), got, want)
				}
			})
		}
	}
}
