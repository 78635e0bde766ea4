package jsoncompact

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzAppend: Append accepts what json.Compact accepts and writes the same bytes after dst,
// and leaves dst as it was when it refuses.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ` [1, 2.5e-3 , -0, "x\"\\\/\b\f\n\r\t\u00e9y"] `, `[]`, `{ }`, `"\u12"`,
		`01`, `1.`, `-`, `1e`, `1E+2`, `tru`, `nulls`, `[1,]`, `{"a" 1}`, `{"a":1,}`, "\"\x01\"", "\"\xff\"",
		`[[[[]]]]`, `{"a":{"b":[true,false,null]}}`, "\t\n\r 7 \n", ``, ` `, `"a" "b"`,
		` { "type" : "TEXT_MESSAGE_CONTENT", "messageId":"m\u00e9","delta":"a\nb", "x":[1, 2.5e3, {"y":null}] } `} {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)))
	f.Add([]byte(strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := Append([]byte("prefix"), b)
		var want bytes.Buffer
		err := json.Compact(&want, b)
		if ok != (err == nil) {
			t.Fatalf("Append(%q) ok = %v, json.Compact: %v", b, ok, err)
		}
		if ok && string(got) != "prefix"+want.String() {
			t.Fatalf("Append(%q) = %q, json.Compact writes %q", b, got[6:], want.Bytes())
		}
		if !ok && string(got) != "prefix" {
			t.Fatalf("Append(%q) refused but wrote %q", b, got)
		}
	})
}
