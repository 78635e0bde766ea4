package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// tableMain prints the side-by-side table of a results directory written by bench/run: files
// named <scenario>.<server>.<n>.json holding a load report (servers "gateway" and
// "reference") or a raw baseline (server "machine"), and <scenario>.<server>.<n>-<i>.json
// for the i-th of several servers loaded at once in run n (the fleet scenario). Every figure
// is the median over the runs n. With --compare BASE_DIR, the results of another build of the
// gateway measured in the same invocation (bench/run compare) stand beside them, with the
// ratio of the two.
func tableMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench table", flag.ContinueOnError)
	fs.SetOutput(stderr)
	compare := fs.String("compare", "", "results directory of the build to compare against")
	baseName := fs.String("base-name", "base", "what to call that build in the table")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: wsbench table [--compare BASE_DIR [--base-name NAME]] RESULTS_DIR")
		return 2
	}
	res, err := loadResults(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "wsbench table:", err)
		return 1
	}
	if *compare == "" {
		res.write(stdout)
		return 0
	}
	base, err := loadResults(*compare)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench table:", err)
		return 1
	}
	writeCompare(stdout, base, res, *baseName)
	return 0
}

// results are the reports of a directory by scenario and server.
type results struct {
	load   map[string][]*report    // "scenario.server"
	raw    map[string][]*rawReport // "scenario"
	fleets map[string][]*report    // "scenario.server.n": the servers loaded at once in run n
	failed []string                // result files of runs that reported nothing
}

func loadResults(dir string) (*results, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	r := &results{load: map[string][]*report{}, raw: map[string][]*rawReport{}, fleets: map[string][]*report{}}
	for _, name := range names {
		parts := strings.Split(strings.TrimSuffix(filepath.Base(name), ".json"), ".")
		if len(parts) != 3 {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		if len(b) == 0 { // the run failed before it could report; bench/run logged why
			r.failed = append(r.failed, filepath.Base(name))
			continue
		}
		if parts[1] == "machine" {
			var rr rawReport
			if err := json.Unmarshal(b, &rr); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			r.raw[parts[0]] = append(r.raw[parts[0]], &rr)
			continue
		}
		var lr report
		if err := json.Unmarshal(b, &lr); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		key := parts[0] + "." + parts[1]
		if n, _, member := strings.Cut(parts[2], "-"); member {
			r.fleets[key+"."+n] = append(r.fleets[key+"."+n], &lr)
			continue
		}
		r.load[key] = append(r.load[key], &lr)
	}
	return r, nil
}

// median returns the median of f over rs, and how many values it had.
func median[T any](rs []T, f func(T) float64) (float64, int) {
	var v []float64
	for _, r := range rs {
		if x := f(r); x == x { // not NaN
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], len(v)
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, len(v)
}

// A cell is one figure of the table: the median v of n runs, printed with format, and the
// text to print instead where the figure is more than one number (v is then the first).
type cell struct {
	v      float64
	n      int
	format string
	text   string
}

func (c cell) String() string {
	switch {
	case c.text != "":
		return c.text
	case c.format == "": // no such figure for this column
		return ""
	case c.n == 0: // not measured
		return "-"
	}
	return fmt.Sprintf(c.format+" (n=%d)", c.v, c.n)
}

// ratioOf is a/b as the table prints it, or "-" where either was not measured.
func ratioOf(a, b cell) string {
	if a.n == 0 || b.n == 0 || b.v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a.v/b.v)
}

// A tableRow is one figure of the gateway beside its anchor (the reference server,
// Centrifugo or the machine's raw limit).
type tableRow struct {
	fig     string
	gw, ref cell
	ratio   string
	target  string
}

func (r *results) write(w io.Writer) {
	fmt.Fprintf(w, "| figure | gateway | reference | ratio | target |\n|---|---|---|---|---|\n")
	for _, x := range r.rows() {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", x.fig, x.gw, x.ref, x.ratio, x.target)
	}
	if len(r.failed) > 0 {
		fmt.Fprintf(w, "\nRuns that failed before reporting (not in the medians): %s\n", strings.Join(r.failed, ", "))
	}
}

// writeCompare writes the figures of two builds of the gateway measured in one invocation:
// the working tree's (tree) beside baseName's (base), their ratio, and the anchor of the
// tree's runs with the tree's ratio to it; figures of scenarios neither ran are left out.
func writeCompare(w io.Writer, base, tree *results, baseName string) {
	fmt.Fprintf(w, "| figure | this tree | %s | tree / %s | anchor | tree / anchor | target |\n|---|---|---|---|---|---|---|\n", baseName, baseName)
	old := map[string]tableRow{}
	for _, x := range base.rows() {
		old[x.fig] = x
	}
	for _, x := range tree.rows() {
		b := old[x.fig]
		if x.gw.n == 0 && b.gw.n == 0 && x.ref.n == 0 {
			continue // a scenario this comparison did not run
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", x.fig, x.gw, b.gw, ratioOf(x.gw, b.gw), x.ref, x.ratio, x.target)
	}
	for _, r := range []struct {
		name string
		res  *results
	}{{"this tree", tree}, {baseName, base}} {
		if len(r.res.failed) > 0 {
			fmt.Fprintf(w, "\nRuns of %s that failed before reporting (not in the medians): %s\n", r.name, strings.Join(r.res.failed, ", "))
		}
	}
}

// rows computes every figure of the table.
func (r *results) rows() []tableRow {
	var out []tableRow
	row := func(fig string, gw, ref cell, ratio, target string) {
		out = append(out, tableRow{fig, gw, ref, ratio, target})
	}
	num := func(v float64, n int, format string) cell { return cell{v: v, n: n, format: format} }
	ratio := func(a, b float64, na, nb int) string { return ratioOf(num(a, na, ""), num(b, nb, "")) }
	none := cell{}
	text := func(c cell, s string) cell { c.text = s; return c }
	eps := func(x *report) float64 { return x.EventsPerSec }
	errs := func(x *report) float64 { return float64(x.Errors + x.TurnsFailed) }

	gw, ngw := median(r.load["throughput.gateway"], eps)
	ref, nref := median(r.load["throughput.reference"], eps)
	row("throughput, events/s delivered", num(gw, ngw, "%.0f"), num(ref, nref, "%.0f"), ratio(gw, ref, ngw, nref), "≥ 4× reference")
	// measured is f, or NaN (left out of the median) for a report that did not measure it.
	measured := func(f func(*report) float64) func(*report) float64 {
		return func(x *report) float64 {
			if v := f(x); v != 0 {
				return v
			}
			return nan
		}
	}
	cpu := measured(func(x *report) float64 { return x.ServerCPUUsPerEvent })
	c1, nc1 := median(r.load["throughput.gateway"], cpu)
	c2, nc2 := median(r.load["throughput.reference"], cpu)
	row("throughput, server CPU µs per event", num(c1, nc1, "%.1f"), num(c2, nc2, "%.1f"), ratio(c1, c2, nc1, nc2), "(steadier on a busy machine)")
	cli := measured(func(x *report) float64 { return x.ClientCPUUsPerEvent })
	c1, nc1 = median(r.load["throughput.gateway"], cli)
	c2, nc2 = median(r.load["throughput.reference"], cli)
	row("throughput, wsbench's own CPU µs per event", num(c1, nc1, "%.1f"), num(c2, nc2, "%.1f"), "", "(shares the cores with the server)")
	js, njs := median(r.raw["raw-jetstream"], func(x *rawReport) float64 { return x.PerSec })
	row("raw JetStream async publishes/s", num(js, njs, "%.0f"), none, ratio(gw, js, ngw, njs), "gateway ≥ 0.5× raw JetStream")
	ws, nws := median(r.raw["raw-websocket"], func(x *rawReport) float64 { return x.PerSec })
	row("raw coder/websocket frames/s", num(ws, nws, "%.0f"), none, ratio(gw, ws, ngw, nws), "machine baseline (gateway / raw)")
	e1, n1 := median(r.load["throughput.gateway"], errs)
	e2, n2 := median(r.load["throughput.reference"], errs)
	row("throughput, errors + failed turns", num(e1, n1, "%.0f"), num(e2, n2, "%.0f"), "", "0")

	for _, l := range []struct {
		name, format, target string
		f                    func(*report) float64
	}{
		{"turns, turns/s completed, 100 sockets × 100 turns × 5 deltas, a thread each", "%.0f", "", func(x *report) float64 { return float64(x.TurnsCompleted) / x.LoadSeconds }},
		{"turns, server CPU µs per turn", "%.0f", "", measured(func(x *report) float64 { return x.ServerCPUSeconds * 1e6 / float64(x.TurnsCompleted) })},
		{"turns, first event from run frame p50 (ms)", "%.2f", "", func(x *report) float64 { return pct(x.FirstEventLatency, 50) }},
		{"turns, first event from run frame p99 (ms)", "%.2f", "", func(x *report) float64 { return pct(x.FirstEventLatency, 99) }},
		{"turns, errors + failed turns", "%.0f", "0", errs},
	} {
		a, na := median(r.load["turns.gateway"], l.f)
		b, nb := median(r.load["turns.reference"], l.f)
		rt := ""
		if l.target == "" {
			rt = ratio(a, b, na, nb)
		}
		row(l.name, num(a, na, l.format), num(b, nb, l.format), rt, l.target)
	}
	for _, l := range []struct {
		name string
		f    func(*report) float64
	}{
		{"latency p99, first event from run frame (ms)", func(x *report) float64 { return pct(x.FirstEventLatency, 99) }},
		{"latency p50, first event from run frame (ms)", func(x *report) float64 { return pct(x.FirstEventLatency, 50) }},
		{"latency p99, server emit → socket write (ms)", func(x *report) float64 { return pct(x.ServerDelivery, 99) }},
		{"latency p99, event timestamp → receipt (ms)", func(x *report) float64 { return pct(x.EventLatency, 99) }},
		{"latency p50, event timestamp → receipt (ms)", func(x *report) float64 { return pct(x.EventLatency, 50) }},
		{"latency scenario, events/s delivered", eps},
	} {
		a, na := median(r.load["latency.gateway"], l.f)
		b, nb := median(r.load["latency.reference"], l.f)
		row(l.name, num(a, na, "%.2f"), num(b, nb, "%.2f"), "", "gateway p99 ≤ 3 ms at 2,000 events/s")
	}
	for _, q := range []int{50, 99} {
		v, n := median(r.load["farstart.gateway"], func(x *report) float64 { return pct(x.FirstEventLatency, q) })
		row(fmt.Sprintf("first event from run frame p%d, NATS 20 ms away (ms)", q), num(v, n, "%.1f"), none, "", "about 20 ms per round trip of a turn's start")
	}
	for k := 1; k <= 3; k++ {
		sc := fmt.Sprintf("burst%d.", k)
		for _, q := range []int{50, 99} {
			f := func(x *report) float64 { return pct(x.FirstEventLatency, q) }
			a, na := median(r.load[sc+"gateway"], f)
			b, nb := median(r.load[sc+"reference"], f)
			row(fmt.Sprintf("burst %d of a fresh process, first event p%d (ms)", k, q), num(a, na, "%.2f"), num(b, nb, "%.2f"), "", "")
		}
		flt := func(x *report) float64 { return float64(x.ServerMinorFaults) }
		a, na := median(r.load[sc+"gateway"], flt)
		b, nb := median(r.load[sc+"reference"], flt)
		row(fmt.Sprintf("burst %d, server minor page faults", k), num(a, na, "%.0f"), num(b, nb, "%.0f"), "", "(fresh pages: `wsbench page-faults`)")
		cpu := func(x *report) float64 { return x.ServerCPUSeconds }
		a, na = median(r.load[sc+"gateway"], cpu)
		b, nb = median(r.load[sc+"reference"], cpu)
		row(fmt.Sprintf("burst %d, server CPU (s)", k), num(a, na, "%.2f"), num(b, nb, "%.2f"), "", "")
	}
	for _, q := range []int{99, 50} {
		v, n := median(r.raw["raw-jetstream-paced"], func(x *rawReport) float64 { return pct(x.Latency, q) })
		row(fmt.Sprintf("raw JetStream publish → ack p%d, paced like the latency scenario (ms)", q), num(v, n, "%.2f"), none, "", "machine baseline")
	}
	perSock := func(x *report) float64 { return x.IdleBytesPerSocket / 1024 }
	a, na := median(r.load["idle.gateway"], perSock)
	b, nb := median(r.load["idle.reference"], perSock)
	row("RSS per idle socket (KiB)", num(a, na, "%.1f"), num(b, nb, "%.1f"), ratio(a, b, na, nb), "≤ 12 KiB and below reference")
	g, ng := median(r.load["idle.gateway"], func(x *report) float64 { return float64(x.Goroutines) })
	s, ns := median(r.load["idle.gateway"], func(x *report) float64 { return float64(x.Sockets) })
	row("gateway goroutines with the idle sockets", text(num(g, ng, "%.0f"), num(g, ng, "%.0f").String()+" for "+num(s, ns, "%.0f").String()+" sockets"), none, "", "one per socket")
	r.writeFleet(row, num, text)
	for _, srv := range []string{"gateway", "reference"} {
		rs := r.load["scale."+srv]
		if len(rs) == 0 {
			continue
		}
		e, n := median(rs, errs)
		t, _ := median(rs, func(x *report) float64 { return float64(x.TurnsCompleted) })
		want, _ := median(rs, func(x *report) float64 { return float64(x.Active * x.Turns) })
		v, _ := median(rs, eps)
		row("scale ("+srv+"), errors; turns completed / started; events/s", text(num(e, n, "%.0f"), fmt.Sprintf("%.0f; %.0f / %.0f; %.0f (n=%d)", e, t, want, v, n)), none, "", "0 errors, all complete")
	}
	cu := func(x *report) float64 {
		if x.Replay == nil {
			return 0
		}
		return x.Replay.EventsPerSec
	}
	a, na = median(r.load["catchup.gateway"], cu)
	b, nb = median(r.load["catchup.reference"], cu)
	row("resume catch-up of a 100,000-event log, events/s", num(a, na, "%.0f"), num(b, nb, "%.0f"), ratio(a, b, na, nb), "≥ 100,000")
	for _, q := range []int{50, 99} {
		f := func(x *report) float64 {
			if x.Replay == nil {
				return nan
			}
			return pct(x.Replay.Latency, q)
		}
		a, na := median(r.load["shortcatchup.gateway"], f)
		b, nb := median(r.load["shortcatchup.centrifugo"], f)
		row(fmt.Sprintf("short catch-up, 1,000 events, dial → last event p%d (ms); reference column: Centrifugo", q),
			num(a, na, "%.2f"), num(b, nb, "%.2f"), ratio(a, b, na, nb), "p50 ≤ Centrifugo's")
	}
	for _, at := range []float64{10, 60, 120, 180} {
		f := func(x *report) float64 {
			for _, s := range x.IdleCurve {
				if s.Seconds >= at-1 {
					return s.RSSPerSocket / 1024
				}
			}
			return nan
		}
		a, na := median(r.load["idlecurve.gateway"], f)
		b, nb := median(r.load["idlecurve.reference"], f)
		if na+nb > 0 {
			row(fmt.Sprintf("RSS per socket %.0f s after one turn each (KiB)", at), num(a, na, "%.1f"), num(b, nb, "%.1f"), ratio(a, b, na, nb), "the fresh figure, and below reference")
		}
	}
	busiest := func(x *report) float64 {
		if len(x.IdleCurve) < 2 { // the first sample has no second before it
			return nan
		}
		peak := 0.0
		for _, s := range x.IdleCurve[1:] {
			peak = max(peak, s.CPUPeakSeconds)
		}
		return peak
	}
	a, na = median(r.load["idlecurve.gateway"], busiest)
	b, nb = median(r.load["idlecurve.reference"], busiest)
	if na+nb > 0 {
		row("idle curve: the server's CPU in its busiest second while idle (s)", num(a, na, "%.2f"), num(b, nb, "%.2f"), ratio(a, b, na, nb), "")
	}
	rs, nrs := median(r.load["drops.gateway"], func(x *report) float64 { return float64(x.Resumes) })
	e, ne := median(r.load["drops.gateway"], errs)
	row("random drops: resumes; errors", text(num(e, ne, "%.0f"), num(rs, nrs, "%.0f").String()+"; "+num(e, ne, "%.0f").String()), none, "", "0 errors")
	return out
}

// pct returns percentile q (50, 95, 99, 999) of p, or NaN.
func pct(p *percentiles, q int) float64 {
	if p == nil {
		return nan
	}
	switch q {
	case 50:
		return p.P50
	case 95:
		return p.P95
	case 99:
		return p.P99
	default:
		return p.P999
	}
}

var nan = math.NaN()

// writeFleet writes the rows of the fleet scenario: idle sockets on several gateways at once,
// each run's RSS per socket over all of them (their RSS with the sockets less before them,
// summed, over the sockets summed).
func (r *results) writeFleet(row func(fig string, gw, ref cell, ratio, target string), num func(float64, int, string) cell, text func(cell, string) cell) {
	type fleet struct{ servers, sockets, errors, perSocket float64 }
	var runs []fleet
	for key, rs := range r.fleets {
		if !strings.HasPrefix(key, "fleet.gateway.") {
			continue
		}
		var f fleet
		var bytes float64
		for _, x := range rs {
			f.servers++
			f.sockets += float64(x.Sockets)
			f.errors += float64(x.Errors)
			bytes += float64(x.RSSIdleBytes - x.RSSBaseBytes)
		}
		f.perSocket = bytes / max(f.sockets, 1) / 1024
		runs = append(runs, f)
	}
	if len(runs) == 0 {
		return
	}
	sk, n := median(runs, func(f fleet) float64 { return f.sockets })
	gw, _ := median(runs, func(f fleet) float64 { return f.servers })
	ps, _ := median(runs, func(f fleet) float64 { return f.perSocket })
	er, _ := median(runs, func(f fleet) float64 { return f.errors })
	row(fmt.Sprintf("idle sockets on %.0f gateways sharing one NATS, RSS per socket (KiB)", gw), text(num(ps, n, "%.1f"), num(ps, n, "%.1f").String()+fmt.Sprintf(" for %.0f sockets, %.0f errors", sk, er)), cell{}, "", "100,000 sockets, ≤ 8 KiB")
}
