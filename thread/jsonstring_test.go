package thread

import (
	"encoding/json"
	"testing"
)

// FuzzJSONString checks that AppendJSONString writes what encoding/json writes for every
// string: its quick path and encoding/json differ in how they may escape, and what a
// transcript's strings become is compared byte for byte (the agent's messages, TestAgentMessages).
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "plain text", "quote \" backslash \\ slash /", "\b\f\n\r\t\x00\x01\x1f\x7f",
		"é 😀 \u00a0 \ufeff", "bad \xff\xfe utf-8 \xe2\x80", "<a href=\"x\">&amp;</a>", "line\u2028sep\u2029", "\xe2\x80\xa8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("AppendJSONString(%q) = %s, want %s", s, got[1:], want)
		}
	})
}
