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
