package thread_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/protocol"
)

// demoLog runs the demo agent on a turn and returns the log the gateway
// stores: the marker, the pipeline's events, and Fail's when the agent fails
// or breaks the protocol.
func demoLog(t *testing.T, runID, text, options string) []json.RawMessage {
	t.Helper()
	in, err := protocol.DecodeRunAgentInput([]byte(`{"threadId":"t","runId":"` + runID + `","messages":[{"id":"u-` + runID +
		`","role":"user","content":` + strconv.Quote(text) + `}],"forwardedProps":{"demo":` + options + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	p := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: true})
	log := []json.RawMessage{protocol.RunAccepted().JSON()}
	violation := false
	err = demo.New().Run(context.Background(), in, func(b []byte) error {
		events, err := p.Push(b)
		for _, e := range events {
			log = append(log, e.JSON())
		}
		if err != nil {
			violation = true
		}
		return err
	})
	switch {
	case violation:
		log = appendEvents(log, p.Fail("protocol violation", "protocol_violation"))
	case err != nil:
		log = appendEvents(log, p.Fail("agent failed", "agent_error"))
	}
	return log
}

func appendEvents(log []json.RawMessage, events []*protocol.Event) []json.RawMessage {
	for _, e := range events {
		log = append(log, e.JSON())
	}
	return log
}

// demoThreads returns a thread per shape of the demo agent, two turns each:
// the shape, then a plain reply.
func demoThreads(t *testing.T) []refThread {
	t.Helper()
	var opts []string
	for _, chunked := range []bool{false, true} {
		for _, reasoning := range []bool{false, true} {
			for _, tool := range []bool{false, true} {
				for _, runs := range []int{1, 2} {
					for _, fail := range []string{"", `"start"`, `"middle"`, "invalid"} {
						o := fmt.Sprintf(`{"intervalMs":0,"tokens":5,"chunked":%t,"reasoning":%t,"toolCall":%t,"runs":%d`, chunked, reasoning, tool, runs)
						switch fail {
						case "invalid":
							o += `,"invalid":true`
						case "":
						default:
							o += `,"fail":` + fail
						}
						opts = append(opts, o+"}")
					}
				}
			}
		}
	}
	var ths []refThread
	for i, o := range opts {
		th := refThread{ID: o}
		for k, opt := range []string{o, `{"intervalMs":0}`} {
			runID := "d" + strconv.Itoa(i) + "x" + strconv.Itoa(k)
			text := "turn " + strconv.Itoa(k)
			th.Runs = append(th.Runs, refRun{RunID: runID, ThreadID: "t", Before: []refOp{user("u-"+runID, text)}, Events: demoLog(t, runID, text, opt)})
		}
		ths = append(ths, th)
	}
	return ths
}

// TestDemoAgent builds, run after run in one thread, the logs the demo agent
// produces for every combination of its shapes (plain, chunked, reasoning, a
// tool call, several runs in a turn, failures, a protocol violation), against
// ChatClient's processor.
func TestDemoAgent(t *testing.T) {
	ths := demoThreads(t)
	results := runReference(t, ths)
	for i, th := range ths {
		tr := build(t, th, results[i].Inputs)
		got := normalise(t, mustJSON(t, tr.Messages), isMinted)
		want := normalise(t, results[i].Messages, isMinted)
		if got != want {
			t.Errorf("demo %s: the transcripts differ %s", th.ID, firstDiff(got, want))
		}
	}
	t.Logf("builder: %d demo agent threads of two turns build the client's messages", len(ths))
}
