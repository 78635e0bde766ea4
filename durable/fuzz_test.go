package durable

import (
	"bytes"
	"encoding/json"
	"strings"
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

// FuzzCompactJSON: compactJSON accepts what json.Compact accepts and writes the same bytes.
func FuzzCompactJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ` [1, 2.5e-3 , -0, "x\"\\\/\b\f\n\r\t\u00e9y"] `, `[]`, `{ }`, `"\u12"`,
		`01`, `1.`, `-`, `1e`, `1E+2`, `tru`, `nulls`, `[1,]`, `{"a" 1}`, `{"a":1,}`, "\"\x01\"", "\"\xff\"",
		`[[[[]]]]`, `{"a":{"b":[true,false,null]}}`, "\t\n\r 7 \n", ``, ` `, `"a" "b"`} {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)))
	f.Add([]byte(strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := compactJSON([]byte("prefix"), b)
		var want bytes.Buffer
		err := json.Compact(&want, b)
		if ok != (err == nil) {
			t.Fatalf("compactJSON(%q) ok = %v, json.Compact: %v", b, ok, err)
		}
		if ok && string(got) != "prefix"+want.String() {
			t.Fatalf("compactJSON(%q) = %q, json.Compact writes %q", b, got[6:], want.Bytes())
		}
		if !ok && string(got) != "prefix" {
			t.Fatalf("compactJSON(%q) refused but wrote %q", b, got)
		}
	})
}
