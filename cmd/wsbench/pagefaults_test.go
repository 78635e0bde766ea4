package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestPageFaults(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"page-faults", "--mib", "8", "--rounds", "2"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep struct {
		PageBytes int          `json:"pageBytes"`
		Rounds    []faultRound `json:"rounds"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	if len(rep.Rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(rep.Rounds))
	}
	for i, r := range rep.Rounds {
		if r.Pages != 8<<20/rep.PageBytes || r.Faults <= 0 || r.WallMicros <= 0 || r.MiBPerSecWrite <= 0 {
			t.Errorf("round %d: %+v: want every page touched, faults counted, positive times", i, r)
		}
	}
	for _, bad := range [][]string{{"page-faults", "--mib", "0"}, {"page-faults", "--rounds", "-1"}, {"page-faults", "--nope"}} {
		if code := run(t.Context(), bad, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
	}
}
