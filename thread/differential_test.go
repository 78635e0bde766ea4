package thread_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"runtime"
	"strconv"
	"sync"
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

// generated is the generated sequences' stored logs, computed once for the tests of the package.
type generated struct {
	logs                 [][]json.RawMessage // accepted, in index order
	ids                  []string
	refused, lone, shots int
}

var (
	genOnce sync.Once
	gen     generated
)

// generatedLogs generates -builder.n sequences of -builder.seed (on every CPU: the
// generator and the pipeline are most of the package's test time) and keeps the
// stored logs of those the client accepts, but for lone surrogates.
func generatedLogs() generated {
	genOnce.Do(func() {
		n := *diffN
		type result struct {
			log []json.RawMessage
			ok  bool
		}
		results := make([]result, n)
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += workers {
					results[i].log, results[i].ok = storedLog(aguigen.Generate(*diffSeed, i))
				}
			}()
		}
		wg.Wait()
		for i, r := range results {
			switch {
			case !r.ok:
				gen.refused++
			case loneSurrogate(r.log):
				gen.lone++
			default:
				if hasType(r.log, "MESSAGES_SNAPSHOT") {
					gen.shots++
				}
				gen.logs = append(gen.logs, r.log)
				gen.ids = append(gen.ids, "gen-"+strconv.FormatUint(*diffSeed, 10)+"-"+strconv.Itoa(i))
			}
		}
	})
	return gen
}

// TestDifferential builds the transcript of generated runs (internal/aguigen,
// the sequences of protocol's TestConformance) with Transcript.Finish and with
// the real StreamProcessor in Node, from the same stored log, and requires
// equal messages after normalise (createdAt removed; the client's random ids
// and the builder's minted ids named by order of first appearance).
//
//	go test ./thread/ -run TestDifferential -v -builder.seed=7 -builder.n=50000
func TestDifferential(t *testing.T) {
	g := generatedLogs()
	type item struct {
		id  string
		log []json.RawMessage
	}
	items := make([]item, len(g.logs))
	for i := range g.logs {
		items[i] = item{g.ids[i], g.logs[i]}
	}
	threads := make([]refThread, len(items))
	for i, it := range items {
		threads[i] = refThread{ID: it.id, Runs: []refRun{{RunID: "run", Events: it.log}}}
	}
	wait := startReference(t, threads)
	built := make([]string, len(items))
	for i, it := range items {
		var tr thread.Transcript
		if err := tr.Finish("run", it.log); err != nil {
			t.Fatalf("%s: Finish: %v", it.id, err)
		}
		built[i] = normalise(t, mustJSON(t, tr.Messages), isServerID)
	}
	results := wait()
	bad := 0
	for i, it := range items {
		got := built[i]
		want := normalise(t, results[i].Messages, isClientID)
		if got != want {
			if bad++; bad <= 3 {
				var b bytes.Buffer
				for _, e := range it.log {
					b.Write(e)
					b.WriteByte('\n')
				}
				t.Errorf("%s: the transcripts differ %s\nstored log:\n%s", it.id, firstDiff(got, want), b.Bytes())
			}
		}
	}
	t.Logf("builder: %d/%d stored logs build the client's messages (seed %d; of %d generated sequences, %d refused by the client, %d with lone surrogates not compared; %d of those compared have a MESSAGES_SNAPSHOT)",
		len(items)-bad, len(items), *diffSeed, *diffN, g.refused, g.lone, g.shots)
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
	// Every third log of the package's generated ones, in another order than
	// TestDifferential's, 3000 at most.
	all := generatedLogs().logs
	var logs [][]json.RawMessage
	for i := len(all) - 1; i >= 0 && len(logs) < 3000; i -= 3 {
		logs = append(logs, all[i])
	}
	threads := threeRunThreads(logs)
	results := runReference(t, threads)
	for _, mode := range []string{"whole", "pageSize", "last"} {
		t.Run(mode, func(t *testing.T) { compareThreads(t, threads, results, mode) })
	}
}

// threeRunThreads makes threads of three runs each of logs, in order, each run after a user
// message of its own.
func threeRunThreads(logs [][]json.RawMessage) []refThread {
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
	return threads
}

// build returns the transcript of th's runs, each accepted with its input of inputs (the
// client's posts) and finished with its events.
func build(t *testing.T, th refThread, inputs []json.RawMessage) thread.Transcript {
	t.Helper()
	var tr thread.Transcript
	for k, r := range th.Runs {
		if err := tr.Accept(r.RunID, inputs[k]); err != nil {
			t.Fatalf("%s: Accept(%s): %v", th.ID, r.RunID, err)
		}
		if err := tr.Finish(r.RunID, r.Events); err != nil {
			t.Fatalf("%s: Finish(%s): %v", th.ID, r.RunID, err)
		}
	}
	return tr
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
	t.Logf("builder: %d/%d threads of three generated runs build the client's messages (seed %d, %s)", len(threads)-bad, len(threads), *diffSeed, mode)
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
