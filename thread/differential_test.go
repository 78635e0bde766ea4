package thread_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/internal/aguigen"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
)

var (
	diffSeed = flag.Uint64("builder.seed", 1, "seed of the sequences TestDifferential generates")
	diffN    = flag.Int("builder.n", 50000, "number of sequences TestDifferential generates")
)

// storedLog is what the gateway stores for a run whose agent sent the case's
// events: the run.accepted marker, then the events the pipeline (with the
// legacy upgrade, as turn does) expands, then, when the agent left the run
// open, the events Fail adds. ok is false when the pipeline refuses an event
// (the client refuses the sequence too: protocol's TestConformance).
func storedLog(c aguigen.Case) (log []json.RawMessage, ok bool) {
	p := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: true})
	log = append(log, protocol.RunAccepted().JSON())
	for _, raw := range c.Events {
		events, err := p.Push(raw)
		if err != nil {
			return nil, false
		}
		for _, e := range events {
			log = append(log, e.JSON())
		}
	}
	if !p.Terminated() {
		for _, e := range p.Fail("agent failed", "agent_error") {
			log = append(log, e.JSON())
		}
	}
	return log, true
}

// loneSurrogate reports whether an event names something with a lone UTF-16
// surrogate (the generator's "lone" cases): JavaScript keeps each as a
// distinct id, a transcript stored as JSON by Go cannot (encoding/json reads
// each as U+FFFD).
func loneSurrogate(log []json.RawMessage) bool {
	for _, e := range log {
		for _, s := range []string{`\ud800`, `\udc00`, `\udfff`, `\ud801`} {
			if bytes.Contains(e, []byte(s)) {
				return true
			}
		}
	}
	return false
}

// TestDifferential builds the transcript of generated runs (internal/aguigen,
// the sequences of protocol's TestConformance) with Transcript.Finish and with
// the real StreamProcessor in Node, from the same stored log, and requires
// equal messages after normalise (createdAt removed; the client's random ids
// and the builder's minted ids named by order of first appearance).
//
//	go test ./thread/ -run TestDifferential -v -builder.seed=7 -builder.n=50000
func TestDifferential(t *testing.T) {
	type item struct {
		c   aguigen.Case
		log []json.RawMessage
	}
	var items []item
	var refused, lone, snapshot int
	for i := 0; i < *diffN; i++ {
		c := aguigen.Generate(*diffSeed, i)
		log, ok := storedLog(c)
		switch {
		case !ok:
			refused++
			continue
		case loneSurrogate(log):
			lone++
			continue
		}
		if hasType(log, "MESSAGES_SNAPSHOT") {
			snapshot++
		}
		items = append(items, item{c, log})
	}
	threads := make([]refThread, len(items))
	for i, it := range items {
		threads[i] = refThread{ID: it.c.ID, Runs: []refRun{{RunID: "run", Events: it.log}}}
	}
	results := runReference(t, threads)
	bad := 0
	for i, it := range items {
		var tr thread.Transcript
		if err := tr.Finish("run", it.log); err != nil {
			t.Fatalf("%s: Finish: %v", it.c.ID, err)
		}
		got := normalise(t, mustJSON(t, tr.Messages), isServerID)
		want := normalise(t, results[i].Messages, isClientID)
		if got != want {
			if bad++; bad <= 3 {
				var b bytes.Buffer
				for _, e := range it.log {
					b.Write(e)
					b.WriteByte('\n')
				}
				t.Errorf("%s: the transcripts differ %s\nstored log:\n%s", it.c.ID, firstDiff(got, want), b.Bytes())
			}
		}
	}
	t.Logf("builder: %d/%d stored logs build the client's messages (seed %d; of %d generated sequences, %d refused by the client, %d with lone surrogates not compared; %d of those compared have a MESSAGES_SNAPSHOT)",
		len(items)-bad, len(items), *diffSeed, *diffN, refused, lone, snapshot)
	if len(items) < 10000 {
		t.Errorf("only %d sequences compared, want at least 10000", len(items))
	}
}

// TestDifferentialThreads chains generated runs into threads of three, each
// run after a user message, and builds them run by run with Accept (of the
// RunAgentInput the client posted) and Finish, against ChatClient's processor
// across the same runs: Accept must recognise what the client posts back of
// what the builder built (lazily created messages under the client's random
// ids, reasoning and tool rows, snapshots' messages).
func TestDifferentialThreads(t *testing.T) {
	var logs [][]json.RawMessage
	for i := 0; len(logs) < 3*1000 && i < *diffN; i++ {
		c := aguigen.Generate(*diffSeed+1, i)
		if log, ok := storedLog(c); ok && !loneSurrogate(log) {
			logs = append(logs, log)
		}
	}
	var threads []refThread
	for i := 0; i+3 <= len(logs); i += 3 {
		th := refThread{ID: "thread-" + strconv.Itoa(i/3)}
		for k := 0; k < 3; k++ {
			n := strconv.Itoa(k + 1)
			th.Runs = append(th.Runs, refRun{RunID: "r" + n, ThreadID: "t",
				Before: []refOp{{Op: "user", ID: "u" + n, Content: "question " + n}}, Events: logs[i+k]})
		}
		threads = append(threads, th)
	}
	results := runReference(t, threads)
	for _, mode := range []string{"whole", "pageSize", "last"} {
		t.Run(mode, func(t *testing.T) { compareThreads(t, threads, results, mode) })
	}
}

// compareThreads builds the threads posting, per mode, the whole list the
// client posted ("whole"), only the messages its previous post did not have
// ("pageSize"), or only the last message ("last": a send before hydration
// ended).
func compareThreads(t *testing.T, threads []refThread, results []refResult, mode string) {
	bad := 0
	for i, th := range threads {
		var tr thread.Transcript
		for k, r := range th.Runs {
			input := results[i].Inputs[k]
			switch mode {
			case "pageSize":
				var prev json.RawMessage
				if k > 0 {
					prev = results[i].Inputs[k-1]
				}
				input = newOnly(t, input, prev)
			case "last":
				input = lastOnly(t, input)
			}
			if err := tr.Accept(r.RunID, input); err != nil {
				t.Fatalf("%s: Accept(%s): %v", th.ID, r.RunID, err)
			}
			if err := tr.Finish(r.RunID, r.Events); err != nil {
				t.Fatalf("%s: Finish(%s): %v", th.ID, r.RunID, err)
			}
		}
		got := normalise(t, mustJSON(t, tr.Messages), isServerID)
		want := normalise(t, results[i].Messages, isClientID)
		if got != want {
			if bad++; bad <= 3 {
				var b bytes.Buffer
				for k, r := range th.Runs {
					b.WriteString("run " + r.RunID + " input: ")
					b.Write(results[i].Inputs[k])
					b.WriteString(" (" + mode + ")")
					b.WriteByte('\n')
					for _, e := range r.Events {
						b.Write(e)
						b.WriteByte('\n')
					}
				}
				t.Errorf("%s: the transcripts differ %s\n%s", th.ID, firstDiff(got, want), b.Bytes())
			}
		}
	}
	t.Logf("builder: %d/%d threads of three generated runs build the client's messages (seed %d, %s)", len(threads)-bad, len(threads), *diffSeed+1, mode)
}

// lastOnly keeps only the last message of input.
func lastOnly(t *testing.T, input json.RawMessage) json.RawMessage {
	t.Helper()
	var in map[string]json.RawMessage
	if err := json.Unmarshal(input, &in); err != nil {
		t.Fatal(err)
	}
	var msgs []json.RawMessage
	_ = json.Unmarshal(in["messages"], &msgs)
	in["messages"] = mustJSON(t, msgs[len(msgs)-1:])
	return mustJSON(t, in)
}

func hasType(log []json.RawMessage, typ string) bool {
	q := []byte(strconv.Quote(typ))
	for _, e := range log {
		if bytes.Contains(e, q) {
			return true
		}
	}
	return false
}

func isClientID(s string) bool { return clientID.MatchString(s) }

func isServerID(s string) bool {
	return serverID.MatchString(s)
}
