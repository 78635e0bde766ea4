package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/protocol"
)

// TestConformance is the differential test of the pipeline against the real
// @ag-ui/client 1.0.0: every vector of testdata/agui-vectors.json and a seeded
// set of generated sequences go through both protocol.Pipeline and the Node
// reference (testdata/npm/agui-reference.mjs: the client's CompatibilityBoundary
// for upgrade cases, EventSchemas.safeParse, transformChunks, verifyEvents), and
// the two must agree: the same accept/reject decision, structurally equal
// expanded events on accept, the same message and the same events before it on
// reject (for schema rejections: the same event index and zod path). The
// subtest "reference" checks that the Node side reproduces every outcome the
// vectors record, and "fail" that Pipeline.Fail ends an open turn as the
// client would end it on receiving that RUN_ERROR. Disagreements are printed
// shrunk to small cases. Node and testdata/npm/node_modules are required.
//
//	go test ./protocol/ -run TestConformance -v -conformance.seed=7 -conformance.n=50000

var (
	conformanceSeed = flag.Uint64("conformance.seed", 1, "seed of the sequences TestConformance generates")
	conformanceN    = flag.Int("conformance.n", 10000, "number of sequences TestConformance generates (at most 1000 with -short)")
)

// confCase is one line the reference reads.
type confCase struct {
	ID     string            `json:"id"`
	Events []json.RawMessage `json:"events"`
	// Upgrade applies the legacy upgrade (CompatibilityBoundary) first.
	Upgrade bool `json:"upgrade,omitempty"`
	// SchemaOnly judges each event by the schema alone (the S* vectors).
	SchemaOnly bool `json:"schemaOnly,omitempty"`
	// SkipSchema bypasses the schema (the † vectors); the pipeline cannot, so
	// it is used only to check the reference against the vectors' outcomes.
	SkipSchema bool `json:"skipSchema,omitempty"`
}

type schemaIssue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

type schemaReject struct {
	Index   int           `json:"index"`
	Path    string        `json:"path"`
	Message string        `json:"message"`
	Issues  []schemaIssue `json:"issues,omitempty"`
}

// outcome is how one side decided a case.
type outcome struct {
	ID     string            `json:"id"`
	OK     bool              `json:"ok"`
	Events []json.RawMessage `json:"events,omitempty"`
	Error  string            `json:"error,omitempty"`
	Schema *schemaReject     `json:"schema,omitempty"`
	// Emitted are the expanded events that passed before a rejection (a
	// client has already seen them).
	Emitted []json.RawMessage `json:"emitted,omitempty"`
	// At is the index of the event the pipeline rejected.
	At int `json:"-"`
	// Crash is set when the client's upgrade threw on event Index instead of
	// deciding (a TypeError on a null where it expects an object).
	Crash *struct {
		Index   int    `json:"index"`
		Message string `json:"message"`
	} `json:"crash,omitempty"`
	// Fatal is a failure of the harness itself (a reference that could not
	// read the case, a panic in the pipeline); it never agrees.
	Fatal string `json:"fatal,omitempty"`
}

func TestConformance(t *testing.T) {
	ref := startReference(t)
	var agree, total int
	defer func() {
		if total == 0 {
			return
		}
		t.Logf("conformance: %d/%d sequences agree (%.2f%%), seed %d (the vectors and the generated sequences)",
			agree, total, 100*float64(agree)/float64(max(total, 1)), *conformanceSeed)
	}()

	t.Run("vectors", func(t *testing.T) {
		vectors := loadVectors(t)
		cases := make([]confCase, len(vectors))
		for i, v := range vectors {
			cases[i] = v.conformanceCase()
		}
		agree += checkAgreement(t, ref, cases, "vectors of testdata/agui-vectors.json")
		total += len(cases)
	})

	// The reference itself must reproduce the outcomes the vectors record
	// (AGUI.md), or the differential test would be measuring against
	// something else than @ag-ui/client 1.0.0 as documented.
	t.Run("reference", func(t *testing.T) {
		vectors := loadVectors(t)
		cases := make([]confCase, len(vectors))
		for i, v := range vectors {
			cases[i] = v.conformanceCase()
			cases[i].SkipSchema = v.SkipSchema
		}
		results := ref.decideAll(t, cases)
		reproduced := 0
		for i, v := range vectors {
			if diff := v.check(results[i]); diff != "" {
				t.Errorf("vector %s: @ag-ui/client %s; the vector expects %s", v.Name, diff, v.describe())
				continue
			}
			reproduced++
		}
		t.Logf("conformance: @ag-ui/client reproduces %d/%d vectors of testdata/agui-vectors.json", reproduced, len(vectors))
	})

	t.Run("generated", func(t *testing.T) {
		n := *conformanceN
		if testing.Short() && n > 1000 {
			n = 1000
		}
		if n < 1 {
			n = 1
		}
		cases := make([]confCase, n)
		for i := range cases {
			cases[i] = generateCase(*conformanceSeed, i)
		}
		agree += checkAgreement(t, ref, cases, fmt.Sprintf("generated sequences, seed %d", *conformanceSeed))
		total += len(cases)
	})

	// Pipeline.Fail ends a turn that the agent left open: its synthetic ENDs
	// and RUN_ERROR must be what the client makes of the same sequence
	// followed by that RUN_ERROR; where the client refuses that sequence (a
	// synthetic END contradicts an owner recorded since), the stored log, the
	// pipeline's events then Fail's, must still be one the client accepts
	// unchanged.
	t.Run("fail", func(t *testing.T) {
		n := *conformanceN
		if testing.Short() && n > 1000 {
			n = 1000
		}
		var cases []confCase
		for i := 0; i < n; i++ {
			c := generateCase(*conformanceSeed, i)
			if _, _, ok := failTurn(c); !ok {
				continue
			}
			c.ID += "+RUN_ERROR"
			c.Events = append(c.Events[:len(c.Events):len(c.Events)], json.RawMessage(failEvent))
			cases = append(cases, c)
		}
		if len(cases) == 0 {
			t.Fatal("no generated sequence leaves a turn open")
		}
		results := ref.decideAll(t, cases)
		// judge names how the client's decision of c (ending with the
		// RUN_ERROR) differs from the pipeline's with Fail.
		judge := func(c confCase, node outcome) (string, outcome) {
			last := len(c.Events) - 1
			if last < 0 || string(c.Events[last]) != failEvent {
				return "", outcome{}
			}
			events, stored, ok := failTurn(confCase{Events: c.Events[:last], Upgrade: c.Upgrade})
			if !ok {
				return "", outcome{}
			}
			got := outcome{ID: c.ID, OK: true, Events: events}
			if node.OK {
				if disagreement(node, got) == "" {
					return "", got
				}
				return signature(node, got), got
			}
			log := ref.decideAll(t, []confCase{{ID: c.ID + "/stored", Events: stored}})[0]
			want := outcome{ID: log.ID, OK: true, Events: events}
			if disagreement(log, want) == "" {
				return "", got
			}
			return "stored log refused: " + signature(log, want), got
		}
		bad := 0
		for i, c := range cases {
			if sig, _ := judge(c, results[i]); sig != "" {
				if bad++; bad <= 3 {
					small := shrinkWith(c, func(c confCase) string {
						sig, _ := judge(c, ref.decideAll(t, []confCase{c})[0])
						return sig
					})
					node := ref.decideAll(t, []confCase{small})[0]
					_, got := judge(small, node)
					t.Errorf("%s, shrunk from %d to %d events: the pipeline's events then Fail(%q, %q) differ from the client's decision (%s)\n%s",
						c.ID, len(c.Events), len(small.Events), "agent failed", "agent_error", sig, formatCase(small, node, got))
				}
			}
		}
		t.Logf("conformance: Pipeline.Fail agrees with a RUN_ERROR through the client in %d/%d open turns", len(cases)-bad, len(cases))
	})
}

// failEvent is the RUN_ERROR the client sees where the pipeline's Fail ends
// the turn.
const failEvent = `{"type":"RUN_ERROR","message":"agent failed","code":"agent_error"}`

// failTurn pushes the case through a pipeline and, when the pipeline accepts
// it without ending the turn, returns every expanded event followed by what
// Fail("agent failed", "agent_error") returns: marked for comparison, and as
// stored.
func failTurn(c confCase) (marked, stored []json.RawMessage, ok bool) {
	if c.SchemaOnly {
		return nil, nil, false
	}
	p := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: c.Upgrade})
	for _, raw := range c.Events {
		events, err := p.Push(raw)
		if err != nil {
			return nil, nil, false
		}
		for _, e := range events {
			stored = append(stored, e.JSON())
		}
	}
	if p.Terminated() {
		return nil, nil, false
	}
	for _, e := range p.Fail("agent failed", "agent_error") {
		stored = append(stored, e.JSON())
	}
	for _, e := range stored {
		marked = append(marked, markLoneSurrogates(e, true))
	}
	return marked, stored, true
}

// checkAgreement decides the cases on both sides, logs the agreement and fails
// with the first few disagreements, each shrunk to a minimal case. It returns
// how many cases agree.
func checkAgreement(t *testing.T, ref *reference, cases []confCase, what string) int {
	t.Helper()
	results := ref.decideAll(t, cases)
	type bad struct {
		c         confCase
		node, got outcome
	}
	var disagree []bad
	schemaTexts, crashes := 0, 0
	var schemaTextExample string
	accepted := 0
	for i, c := range cases {
		node, got := results[i], pipelineDecide(c)
		if disagreement(node, got) != "" {
			disagree = append(disagree, bad{c, node, got})
			continue
		}
		if node.OK {
			accepted++
		}
		if node.Crash != nil {
			crashes++
		}
		if node.Schema != nil && got.Schema != nil && node.Schema.Message != got.Schema.Message {
			schemaTexts++
			if schemaTextExample == "" {
				schemaTextExample = fmt.Sprintf("%s event %d at %q: zod %q, protocol %q", c.ID, node.Schema.Index, node.Schema.Path, node.Schema.Message, got.Schema.Message)
			}
		}
	}
	agree := len(cases) - len(disagree)
	t.Logf("conformance: %d/%d sequences agree (%.2f%%), %s; %d accepted, %d rejected by both",
		agree, len(cases), 100*float64(agree)/float64(len(cases)), what, accepted, agree-accepted)
	if schemaTexts > 0 {
		// Only the index and path of a schema rejection are compared; the
		// wording is zod's, quoted where the vectors quote it.
		t.Logf("conformance: %d schema rejections agree on index and path but not on the message, e.g. %s", schemaTexts, schemaTextExample)
	}
	if crashes > 0 {
		t.Logf("conformance: in %d agreeing sequences the client's upgrade throws (a TypeError on a null element) where protocol rejects the same event", crashes)
	}
	if len(disagree) == 0 {
		return agree
	}

	// Group by the kind of disagreement, show the smallest case of each of the
	// first few groups, shrunk.
	sort.SliceStable(disagree, func(i, j int) bool { return len(disagree[i].c.Events) < len(disagree[j].c.Events) })
	groups := map[string]int{}
	var order []string
	examples := map[string][]bad{} // up to 3 per kind, with different messages
	for _, d := range disagree {
		sig := signature(d.node, d.got)
		if groups[sig] == 0 {
			order = append(order, sig)
		}
		groups[sig]++
		distinct := len(examples[sig]) < 3
		for _, e := range examples[sig] {
			if e.node.Error == d.node.Error && e.got.Error == d.got.Error {
				distinct = false
			}
		}
		if distinct {
			examples[sig] = append(examples[sig], d)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "conformance: %d/%d %s disagree, in %d kinds:\n", len(disagree), len(cases), what, len(order))
	for _, sig := range order {
		fmt.Fprintf(&b, "  %5d × %s\n", groups[sig], sig)
	}
	// The first example of every kind, then further ones, at most 10 in all.
	var show []bad
	for round := 0; round < 3; round++ {
		for _, sig := range order {
			if round < len(examples[sig]) && len(show) < 10 {
				show = append(show, examples[sig][round])
			}
		}
	}
	for _, d := range show {
		c := shrink(t, ref, d.c)
		node := ref.decideAll(t, []confCase{c})[0]
		got := pipelineDecide(c)
		fmt.Fprintf(&b, "\n--- %s, shrunk from %d to %d events (%s)\n%s", c.ID, len(d.c.Events), len(c.Events), signature(node, got), formatCase(c, node, got))
	}
	if len(show) < len(disagree) {
		fmt.Fprintf(&b, "\n(%d more disagreeing sequences not shown; rerun with -conformance.seed=%d to reproduce)\n", len(disagree)-len(show), *conformanceSeed)
	}
	t.Error(b.String())
	return agree
}

// signature names the kind of a disagreement, for grouping: what differs,
// and the two outcomes with ids masked.
func signature(node, got outcome) string {
	kind := func(o outcome) string {
		switch {
		case o.Fatal != "":
			return "fatal " + clip(o.Fatal, 60)
		case o.OK:
			return "accept"
		case o.Crash != nil:
			return "crash " + clip(maskIDs(o.Crash.Message), 60)
		case o.Schema != nil:
			return "schema " + o.Schema.Path
		default:
			return "reject " + clip(maskIDs(o.Error), 70)
		}
	}
	d := disagreement(node, got)
	if i := strings.Index(d, "expanded event "); i >= 0 {
		// Events that differ: grouped by event type and path, whatever the
		// outcome after them.
		d = d[i:]
		if j := strings.Index(d, ": client"); j >= 0 {
			d = d[:j]
		}
		return "expanded events differ: " + digits.ReplaceAllString(strings.TrimPrefix(d, "expanded event "), "N")
	}
	return fmt.Sprintf("%s: client %s | protocol %s", disagreementKind(node, got), kind(node), kind(got))
}

var digits = regexp.MustCompile(`[0-9]+`)

var (
	quotedPattern = regexp.MustCompile(`'[^']*'|"[^"]*"`)
	listPattern   = regexp.MustCompile(`still active: .*`)
)

func maskIDs(s string) string {
	return listPattern.ReplaceAllString(quotedPattern.ReplaceAllString(s, "…"), "still active: …")
}

// disagreementKind is disagreement without its details.
func disagreementKind(node, got outcome) string {
	d := disagreement(node, got)
	if i := strings.IndexAny(d, "0123456789\""); i > 0 {
		d = strings.TrimSpace(d[:i])
	}
	return d
}

// clip shortens s to n runes.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

// shrink makes a disagreeing case small while it still disagrees in the same
// way: first it drops whole events, then members and array elements inside
// the events that remain.
func shrink(t *testing.T, ref *reference, c confCase) confCase {
	t.Helper()
	return shrinkWith(c, func(c confCase) string {
		node, got := ref.decideAll(t, []confCase{c})[0], pipelineDecide(c)
		if disagreement(node, got) == "" {
			return ""
		}
		return signature(node, got)
	})
}

// shrinkWith shrinks c while judge, which names the disagreement of a case
// ("" when there is none), names the same one as for c.
func shrinkWith(c confCase, judge func(confCase) string) confCase {
	sig := judge(c)
	budget := 600
	stillBad := func(c confCase) bool {
		budget--
		return judge(c) == sig
	}
	for changed := true; changed && budget > 0; {
		changed = false
		for i := len(c.Events) - 1; i >= 0 && len(c.Events) > 1 && budget > 0; i-- {
			try := c
			try.Events = append(append([]json.RawMessage{}, c.Events[:i]...), c.Events[i+1:]...)
			if stillBad(try) {
				c, changed = try, true
			}
		}
	}
	for i := range c.Events {
		if surrogateEscape.Match(c.Events[i]) {
			// Re-encoding would turn a lone surrogate into U+FFFD, another id.
			continue
		}
		for changed := true; changed && budget > 0; {
			changed = false
			v, err := parseOrdered(c.Events[i])
			if err != nil {
				break
			}
			for _, smaller := range simplifications(v) {
				if budget <= 0 {
					break
				}
				b, err := json.Marshal(smaller)
				if err != nil {
					continue
				}
				try := c
				try.Events = append([]json.RawMessage{}, c.Events...)
				try.Events[i] = b
				if stillBad(try) {
					c, changed = try, true
					break
				}
			}
		}
	}
	return c
}

var surrogateEscape = regexp.MustCompile(`\\[uU][dD][89a-fA-F]`)

// parseOrdered decodes JSON keeping member order, duplicate keys and number
// spellings (objects as obj, numbers as json.Number).
func parseOrdered(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var value func() (any, error)
	value = func() (any, error) {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		switch tok {
		case json.Delim('{'):
			o := obj{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := value()
				if err != nil {
					return nil, err
				}
				o = append(o, member{Key: k.(string), Val: v})
			}
			_, err := d.Token()
			return o, err
		case json.Delim('['):
			a := []any{}
			for d.More() {
				v, err := value()
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := d.Token()
			return a, err
		}
		return tok, nil
	}
	return value()
}

// simplifications returns the values that are v with one member or array
// element removed, at any depth, shallowest first.
func simplifications(v any) []any {
	var out []any
	switch x := v.(type) {
	case obj:
		for i := range x {
			out = append(out, append(append(obj{}, x[:i]...), x[i+1:]...))
		}
		for i, m := range x {
			for _, s := range simplifications(m.Val) {
				y := append(obj{}, x...)
				y[i] = member{Key: m.Key, Val: s}
				out = append(out, y)
			}
		}
	case []any:
		for i := range x {
			out = append(out, append(append([]any{}, x[:i]...), x[i+1:]...))
		}
		for i, e := range x {
			for _, s := range simplifications(e) {
				y := append([]any{}, x...)
				y[i] = s
				out = append(out, y)
			}
		}
	}
	return out
}

func formatCase(c confCase, node, got outcome) string {
	var b strings.Builder
	mode := ""
	if c.Upgrade {
		mode = " (upgrade)"
	}
	if c.SchemaOnly {
		mode = " (schema only)"
	}
	fmt.Fprintf(&b, "input%s:\n", mode)
	for _, e := range c.Events {
		fmt.Fprintf(&b, "    %s\n", e)
	}
	fmt.Fprintf(&b, "  @ag-ui/client: %s\n", describe(node))
	fmt.Fprintf(&b, "  protocol:      %s\n", describe(got))
	if diff := disagreement(node, got); diff != "" {
		fmt.Fprintf(&b, "  difference:    %s\n", diff)
	}
	return b.String()
}

func describe(o outcome) string {
	switch {
	case o.Fatal != "":
		return "FATAL " + o.Fatal
	case o.OK:
		var b strings.Builder
		b.WriteString("accepted →")
		for _, e := range o.Events {
			fmt.Fprintf(&b, "\n                   %s", e)
		}
		return b.String()
	case o.Schema != nil:
		s := fmt.Sprintf("schema rejects event %d: %q %s", o.Schema.Index, o.Schema.Path, o.Schema.Message)
		if len(o.Schema.Issues) > 1 {
			s += fmt.Sprintf(" (all issues: %v)", o.Schema.Issues)
		}
		return s + emitted(o)
	default:
		return "rejected: " + o.Error + emitted(o)
	}
}

func emitted(o outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n                 after %d events:", len(o.Emitted))
	for _, e := range o.Emitted {
		fmt.Fprintf(&b, "\n                   %s", e)
	}
	return b.String()
}

// disagreement returns "" when the two outcomes agree, else what differs.
func disagreement(node, got outcome) string {
	if node.Fatal != "" || got.Fatal != "" {
		return "harness failure"
	}
	if node.OK != got.OK {
		return "accept/reject decision"
	}
	if node.Crash != nil {
		// Any rejection of the same event agrees with a crash.
		if got.At != node.Crash.Index {
			return fmt.Sprintf("the client's upgrade throws on event %d, protocol rejects event %d", node.Crash.Index, got.At)
		}
		if diff := sameEvents(node.Emitted, got.Emitted); diff != "" {
			return "events before the rejection: " + diff
		}
		return ""
	}
	if !node.OK {
		if (node.Schema == nil) != (got.Schema == nil) {
			return "schema rejection on one side only"
		}
		if node.Schema != nil {
			if node.Schema.Index != got.Schema.Index {
				return fmt.Sprintf("schema rejects event %d vs %d", node.Schema.Index, got.Schema.Index)
			}
			if node.Schema.Path != got.Schema.Path {
				return fmt.Sprintf("schema path %q vs %q", node.Schema.Path, got.Schema.Path)
			}
			return ""
		}
		n, g := normalise(nil, node.Error), normalise(nil, got.Error)
		if n != g {
			return "message"
		}
		if diff := sameEvents(node.Emitted, got.Emitted); diff != "" {
			return "events before the rejection: " + diff
		}
		return ""
	}
	return sameEvents(node.Events, got.Events)
}

// sameEvents compares two event lists structurally ("" when equal).
func sameEvents(a, b []json.RawMessage) string {
	av, err1 := decodeEvents(a)
	bv, err2 := decodeEvents(b)
	if err := errors.Join(err1, err2); err != nil {
		return "undecodable events: " + err.Error()
	}
	if len(av) != len(bv) {
		return fmt.Sprintf("%d expanded events vs %d", len(av), len(bv))
	}
	for i := range av {
		if !reflect.DeepEqual(av[i], bv[i]) {
			typ, _ := av[i].(map[string]any)["type"].(string)
			path, x, y := firstDiff(av[i], bv[i], "")
			return fmt.Sprintf("expanded event %d (%s) differs at %s: client %s, protocol %s", i, typ, path, x, y)
		}
	}
	return ""
}

// firstDiff returns the first path (keys sorted) where a and b differ, and
// the two values there ("absent" for a missing key).
func firstDiff(a, b any, path string) (string, string, string) {
	show := func(v any) string {
		b, _ := json.Marshal(v)
		return clip(string(b), 120)
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := make([]string, 0, len(x)+len(y))
		for k := range x {
			keys = append(keys, k)
		}
		for k := range y {
			if _, ok := x[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			xv, xok := x[k]
			yv, yok := y[k]
			switch {
			case !xok:
				return join(k), "absent", show(yv)
			case !yok:
				return join(k), show(xv), "absent"
			case !reflect.DeepEqual(xv, yv):
				return firstDiff(xv, yv, join(k))
			}
		}
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			break
		}
		for i := range x {
			if !reflect.DeepEqual(x[i], y[i]) {
				return firstDiff(x[i], y[i], join(strconv.Itoa(i)))
			}
		}
	}
	if path == "" {
		path = "(the event)"
	}
	return path, show(a), show(b)
}

// markLoneSurrogates returns a copy of b in which every unpaired UTF-16
// surrogate is written as the text <lone-XXXX>. JSON.parse keeps "\ud800"
// and "\udc00" apart, but Go's decoder turns both into U+FFFD, so both
// sides' outputs are marked before they are decoded. In JSON text (json set)
// that is a \uXXXX escape without its partner inside a string; in any text,
// a surrogate encoded as UTF-8 bytes (WTF-8: 0xED 0xA0-0xBF 0x80-0xBF).
func markLoneSurrogates(b []byte, json bool) []byte {
	out := make([]byte, 0, len(b))
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	inString := false
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == 0xED && i+2 < len(b) && b[i+1] >= 0xA0 && b[i+1] <= 0xBF && b[i+2]&0xC0 == 0x80:
			r := 0xD000 | rune(b[i+1]&0x3F)<<6 | rune(b[i+2]&0x3F)
			out = fmt.Appendf(out, "<lone-%04X>", r)
			i += 3
		case !json:
			out = append(out, c)
			i++
		case c == '"':
			inString = !inString
			out = append(out, c)
			i++
		case c == '\\' && inString:
			r, ok := hex4(i)
			if ok && r >= 0xD800 && r <= 0xDFFF {
				if r2, ok2 := hex4(i + 6); r <= 0xDBFF && ok2 && r2 >= 0xDC00 && r2 <= 0xDFFF {
					out = append(out, b[i:i+12]...)
					i += 12
					continue
				}
				out = fmt.Appendf(out, "<lone-%04X>", r)
				i += 6
				continue
			}
			out = append(out, b[i:min(i+2, len(b))]...)
			i += 2
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

// lone marks the lone surrogates of a Go string (WTF-8 bytes).
func lone(s string) string { return string(markLoneSurrogates([]byte(s), false)) }

// uuidPattern matches the ids the legacy upgrade mints.
var uuidPattern = regexp.MustCompile(`(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// uuids maps each distinct minted id of one outcome to <uuidN>, in order of
// appearance, so that two runs of the upgrade compare equal.
type uuids map[string]string

func (u uuids) replace(s string) string {
	return uuidPattern.ReplaceAllStringFunc(s, func(id string) string {
		id = strings.ToLower(id)
		if _, ok := u[id]; !ok {
			u[id] = fmt.Sprintf("<uuid%d>", len(u)+1)
		}
		return u[id]
	})
}

// normalise rewrites minted ids in a string (an error message) with u, or
// with a fresh map when u is nil.
func normalise(u uuids, s string) string {
	if u == nil {
		u = uuids{}
	}
	return u.replace(s)
}

// decodeEvents decodes events into plain values (key order and number
// spelling do not matter), with minted ids normalised in order of appearance
// (events in order, keys sorted within an event).
func decodeEvents(events []json.RawMessage) ([]any, error) {
	u := uuids{}
	out := make([]any, len(events))
	for i, e := range events {
		var v any
		if err := json.Unmarshal(e, &v); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		out[i] = walkStrings(v, u.replace)
	}
	return out, nil
}

func walkStrings(v any, f func(string) string) any {
	switch x := v.(type) {
	case string:
		return f(x)
	case []any:
		for i := range x {
			x[i] = walkStrings(x[i], f)
		}
		return x
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			x[k] = walkStrings(x[k], f)
		}
		return x
	default:
		return v
	}
}

// pipelineDecide decides a case with the Go side.
func pipelineDecide(c confCase) (o outcome) {
	o.ID = c.ID
	defer func() {
		if r := recover(); r != nil {
			o = outcome{ID: c.ID, Fatal: fmt.Sprintf("panic: %v", r)}
		}
	}()
	if c.SchemaOnly {
		for i, raw := range c.Events {
			e, err := protocol.DecodeEvent(raw)
			if err != nil {
				return rejection(c.ID, i, err)
			}
			o.Events = append(o.Events, markLoneSurrogates(e.JSON(), true))
		}
		o.OK = true
		return o
	}
	p := protocol.NewPipeline(protocol.PipelineOptions{Upgrade: c.Upgrade})
	for i, raw := range c.Events {
		events, err := p.Push(raw)
		for _, e := range events {
			if !compact(e.JSON()) {
				return outcome{ID: c.ID, Fatal: fmt.Sprintf("event %d: Event.JSON() is not compact JSON: %q", i, e.JSON())}
			}
			o.Events = append(o.Events, markLoneSurrogates(e.JSON(), true))
		}
		if err != nil {
			r := rejection(c.ID, i, err)
			r.Emitted = o.Events
			return r
		}
	}
	o.OK = true
	return o
}

// compact reports whether b is one JSON value without insignificant
// whitespace (the gateway writes it as one NDJSON line).
func compact(b []byte) bool {
	var buf bytes.Buffer
	return json.Compact(&buf, b) == nil && bytes.Equal(buf.Bytes(), b)
}

func rejection(id string, i int, err error) outcome {
	var se *protocol.SchemaError
	if errors.As(err, &se) {
		return outcome{ID: id, At: i, Error: lone(err.Error()), Schema: &schemaReject{Index: i, Path: lone(se.Path), Message: lone(se.Message)}}
	}
	var ve *protocol.ViolationError
	if errors.As(err, &ve) {
		return outcome{ID: id, At: i, Error: lone(ve.Error())}
	}
	return outcome{ID: id, Fatal: fmt.Sprintf("event %d: error of type %T, neither *SchemaError nor *ViolationError: %v", i, err, err)}
}

// vector is one entry of testdata/agui-vectors.json.
type vector struct {
	Name        string            `json:"name"`
	Section     string            `json:"section"`
	Events      []json.RawMessage `json:"events"`
	Upgrade     bool              `json:"upgrade"`
	SkipSchema  bool              `json:"skipSchema"`
	Accept      []json.RawMessage `json:"accept"`
	Reject      *string           `json:"reject"`
	SchemaError *schemaReject     `json:"schemaError"`
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "agui-vectors.json"))
	if err != nil {
		t.Fatalf("read vectors: %v", err)
	}
	var file struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatalf("decode testdata/agui-vectors.json: %v", err)
	}
	if len(file.Vectors) == 0 {
		t.Fatal("testdata/agui-vectors.json holds no vectors")
	}
	return file.Vectors
}

// conformanceCase is the vector as a case for both sides. The schema vectors
// hold single events judged by the schema alone. The † vectors are run with
// the schema on both sides, as the pipeline always checks it.
func (v vector) conformanceCase() confCase {
	return confCase{ID: "vector-" + v.Name, Events: v.Events, Upgrade: v.Upgrade, SchemaOnly: v.Section == "Schema"}
}

// check compares the reference's outcome with the one the vector records
// ("" when they agree). "<uuidN>" placeholders in the vector match minted ids.
func (v vector) check(o outcome) string {
	if o.Fatal != "" {
		return "failed: " + o.Fatal
	}
	switch {
	case v.Accept != nil:
		if !o.OK {
			return describe(o)
		}
		want, err1 := decodeEvents(v.Accept)
		got, err2 := decodeEvents(o.Events)
		if err := errors.Join(err1, err2); err != nil {
			return "undecodable: " + err.Error()
		}
		if !reflect.DeepEqual(want, got) {
			return describe(o)
		}
	case v.Reject != nil:
		if o.OK || o.Schema != nil || normalise(nil, o.Error) != *v.Reject {
			return describe(o)
		}
	case v.SchemaError != nil:
		if o.Schema == nil || o.Schema.Index != v.SchemaError.Index || o.Schema.Path != v.SchemaError.Path || o.Schema.Message != v.SchemaError.Message {
			return describe(o)
		}
	default:
		return "(the vector records no outcome)"
	}
	return ""
}

func (v vector) describe() string {
	switch {
	case v.Accept != nil:
		return describe(outcome{OK: true, Events: v.Accept})
	case v.Reject != nil:
		return "rejected: " + *v.Reject
	case v.SchemaError != nil:
		return describe(outcome{Schema: v.SchemaError})
	}
	return "nothing"
}

// reference is the Node process running testdata/npm/agui-reference.mjs; it
// decides cases in order, one result line per case line.
type reference struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *testenv.LockedBuffer
}

// startReference starts the reference; it fails the test (never skips) when
// node or the npm packages are missing.
func startReference(t *testing.T) *reference {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("conformance: node (Node.js 20 or later) is not on PATH: %v; install it, then run `npm ci` in testdata/npm", err)
	}
	npmDir := filepath.Join(testenv.MustModuleRoot(t), "testdata", "npm")
	for _, need := range []string{"agui-reference.mjs", "node_modules/@ag-ui/client/package.json", "node_modules/@ag-ui/core/package.json"} {
		if _, err := os.Stat(filepath.Join(npmDir, need)); err != nil {
			t.Fatalf("conformance: %s is missing (%v): run `npm ci` in testdata/npm", need, err)
		}
	}
	cmd := exec.Command(node, "agui-reference.mjs")
	cmd.Dir = npmDir
	cmd.Env = append(os.Environ(), "SUPPRESS_TRANSFORMATION_WARNINGS=true")
	stderr := &testenv.LockedBuffer{}
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("conformance: stdin pipe: %v", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("conformance: stdout pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("conformance: start node: %v", err)
	}
	ref := &reference{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20), stderr: stderr}
	t.Cleanup(func() {
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("conformance: node exited: %v; stderr:\n%s", err, stderr)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("conformance: node did not exit within 10s of its input closing; killed it")
		}
	})
	return ref
}

// decideAll sends the cases and reads one outcome per case, in order.
func (r *reference) decideAll(t testing.TB, cases []confCase) []outcome {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	werr := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(r.in, 1<<20)
		enc := json.NewEncoder(w)
		for _, c := range cases {
			if err := enc.Encode(c); err != nil {
				werr <- err
				return
			}
		}
		werr <- w.Flush()
	}()
	results := make([]outcome, len(cases))
	for i := range cases {
		line, err := r.out.ReadBytes('\n')
		if err != nil {
			t.Fatalf("conformance: read the reference's answer to %s: %v; node stderr:\n%s", cases[i].ID, err, r.stderr)
		}
		if err := json.Unmarshal(markLoneSurrogates(line, true), &results[i]); err != nil {
			t.Fatalf("conformance: decode the reference's answer to %s: %v: %s", cases[i].ID, err, line)
		}
		if results[i].ID != cases[i].ID && results[i].Fatal == "" {
			t.Fatalf("conformance: the reference answered %q to case %q", results[i].ID, cases[i].ID)
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("conformance: write cases to the reference: %v", err)
	}
	return results
}
