package conversation

import (
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/protocol"
)

// FuzzResumeParams feeds arbitrary runId and offset query values to the resume socket's
// parameter check: it never panics, and what it lets through to the Store is a resumable
// runId and an offset of the form gateways mint (non-empty, no whitespace, no control
// character, bounded); everything else gets the close reason PROTOCOL.md section 3 names.
func FuzzResumeParams(f *testing.F) {
	for _, seed := range [][2]string{
		{"run-1", "-1"},
		{"run-1", "now"},
		{"run-1", "000001-000000000002-0000-204608323489"},
		{"run-1", ""},
		{"", "-1"},
		{"run\x00", "-1"},
		{"run-1", " 000001-000000000002-0000-204608323489"},
		{"run-1", "a\r\nb"},
		{strings.Repeat("r", 513), "-1"},
		{"\xff\xfe", "now"},
		{"run-1", strings.Repeat("0", 300)},
	} {
		f.Add(seed[0], seed[1])
	}
	reasons := map[string]bool{"": true, "no resume offset": true, "invalid runId": true, "invalid offset": true}
	f.Fuzz(func(t *testing.T, runID, offset string) {
		reason := checkResume(runID, offset)
		if !reasons[reason] {
			t.Fatalf("checkResume(%q, %q) = %q, not a close reason of PROTOCOL.md", runID, offset, reason)
		}
		if reason != "" {
			return
		}
		if !protocol.ValidRunID(runID) {
			t.Errorf("checkResume(%q, %q) let through a runId no run frame may carry", runID, offset)
		}
		if offset == "" || len(offset) > 256 || strings.ContainsFunc(offset, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			t.Errorf("checkResume(%q, %q) let through an offset no gateway mints", runID, offset)
		}
	})
}
