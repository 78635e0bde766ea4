package durable

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParseOffset: an offset parses only in the form formatOffset writes, and back to it.
func FuzzParseOffset(f *testing.F) {
	for _, s := range []string{zeroOffset, formatOffset(7), "-1", "now", "0_0", "../0000000000000001_0000000000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		seq, ok := parseOffset(s)
		if ok && formatOffset(seq) != s {
			t.Fatalf("parseOffset(%q) = %d, but formatOffset(%d) = %q", s, seq, seq, formatOffset(seq))
		}
	})
}

// FuzzJSONBody: a JSON-mode body is stored as elements that read back, wrapped in brackets,
// as a JSON array of the values sent (an array's elements, or the one value).
func FuzzJSONBody(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,2,3]`, `[[1],[2]]`, `[]`, ` "x\ny" `, `[{"a":[]}, null]`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := jsonBody(b, false, new(bytes.Buffer))
		if err != nil {
			return
		}
		var got []json.RawMessage
		if err := json.Unmarshal(append(append([]byte{'['}, out...), ']'), &got); err != nil {
			t.Fatalf("jsonBody(%q) = %q, which does not read back: %v", b, out, err)
		}
		var sent any
		json.Unmarshal(b, &sent)
		want := 1
		if arr, ok := sent.([]any); ok {
			want = len(arr)
		}
		if len(got) != want {
			t.Fatalf("jsonBody(%q) stores %d values, want %d", b, len(got), want)
		}
	})
}
