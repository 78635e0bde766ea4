package main

import (
	"encoding/json"
	"testing"
)

// TestHostile: wsbench hostile against a gateway with --auth jwt and --max-principal-turns 4
// reports the refusals of the bound, at most the bound's turns running (and the other
// principal's one), 429 answers at the HTTP doors, and the other principal's turns, all
// finished; with the hostile clients in this process, and in a process of their own pinned
// to a CPU (--flood-cpus).
func TestHostile(t *testing.T) {
	for _, tt := range []struct {
		name  string
		extra []string
	}{{"in process", nil}, {"flood process", []string{"--flood-cpus", "0"}}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WSBENCH_TEST_MAIN", "1") // the flood process is this binary (TestMain)
			testHostile(t, tt.extra...)
		})
	}
}

func testHostile(t *testing.T, extra ...string) {
	const secret = "a secret of the hostile test, 32 bytes or more"
	gw := startProcessEnv(t, "gateway", buildGateway(t), []string{"HOSTILE_SECRET=" + secret},
		"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json", "--log-level", "info",
		"--drain-timeout", "2s", "--auth", "jwt", "--jwt-secret-env", "HOSTILE_SECRET", "--max-principal-turns", "4",
		"--refusal-delay", "100ms") // at the default (500 ms) 2 s of attack make too few requests to reach every door
	t.Setenv("HOSTILE_SECRET", secret)
	code, out, errOut := wsbenchRun(t, append([]string{"hostile", "--url", "http://" + gw.addr, "--jwt-secret-env", "HOSTILE_SECRET",
		"--attack", "2s", "--idle", "1s", "--workers", "2", "--others", "1", "--json"}, extra...)...)
	if code != 0 {
		t.Fatalf("wsbench hostile exit %d\n%s\n%s", code, out, errOut)
	}
	var rep hostileReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if rep.Refusals["max_principal_turns"] == 0 {
		t.Errorf("refusals %v, want some for max_principal_turns", rep.Refusals)
	}
	if rep.RunningMax > 5 || rep.Samples == 0 {
		t.Errorf("turns running at most %v over %d samples, want at most 4 and the other principal's 1", rep.RunningMax, rep.Samples)
	}
	for _, door := range []string{"sse", "ndjson", "agui", "thread"} {
		if rep.Doors[door]["429"] == 0 {
			t.Errorf("%s answers %v, want 429s", door, rep.Doors[door])
		}
	}
	if rep.Idle.Turns == 0 || rep.Attack.Turns == 0 || rep.Idle.Failed+rep.Attack.Failed != 0 || rep.Attack.FirstEvent == nil {
		t.Errorf("the other principal's turns: idle %+v, attack %+v, want all finished and measured", rep.Idle, rep.Attack)
	}
}
