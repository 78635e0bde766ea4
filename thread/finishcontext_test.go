package thread_test

import (
	"encoding/json"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// TestFinishContext: a later run's agent is given the same messages whether the earlier run
// is applied with Finish or with FinishContext (which merges no metadata), for the package's
// generated runs, each finished after the next run's acceptance, as a run's start applies a
// reply whose finish has not landed; and the messages keep their ids, roles and parts.
func TestFinishContext(t *testing.T) {
	logs := generatedLogs().logs
	if len(logs) > 5000 {
		logs = logs[:5000]
	}
	agentJSON := func(msgs []thread.Message) string {
		b, err := json.Marshal(thread.AgentMessages(msgs))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	shape := func(msgs []thread.Message) string {
		for i := range msgs {
			msgs[i].Metadata, msgs[i].CreatedAt = nil, ""
		}
		b, err := json.Marshal(msgs)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	withMetadata := 0
	for i, log := range logs {
		var tr thread.Transcript
		if err := tr.Accept("r1", input(t, "r1", "", `{"id":"u1","role":"user","content":"one"}`)); err != nil {
			t.Fatal(err)
		}
		if err := tr.Accept("r2", input(t, "r2", "", `{"id":"u2","role":"user","content":"two"}`)); err != nil {
			t.Fatal(err)
		}
		whole, ctx := tr.Clone(), tr.Clone()
		errWhole, errCtx := whole.Finish("r1", log), ctx.FinishContext("r1", log)
		if (errWhole == nil) != (errCtx == nil) {
			t.Fatalf("log %d: Finish: %v, FinishContext: %v", i, errWhole, errCtx)
		}
		if errWhole != nil {
			continue
		}
		for _, m := range whole.Messages {
			if len(m.Metadata) > 0 {
				withMetadata++
				break
			}
		}
		if got, want := agentJSON(ctx.Context("r2")), agentJSON(whole.Context("r2")); got != want {
			t.Fatalf("log %d: the agent's messages after FinishContext\n%s\nafter Finish\n%s", i, got, want)
		}
		if got, want := shape(ctx.Messages), shape(whole.Messages); got != want {
			t.Fatalf("log %d: the messages after FinishContext\n%s\nafter Finish\n%s", i, got, want)
		}
		if len(ctx.Anchors) != len(whole.Anchors) || ctx.Interrupts == nil != (whole.Interrupts == nil) {
			t.Fatalf("log %d: anchors or interrupts differ", i)
		}
	}
	t.Logf("%d logs, %d of them with message metadata", len(logs), withMetadata)
	if withMetadata == 0 {
		t.Error("no generated log has message metadata: the test compares nothing it changes")
	}
}
