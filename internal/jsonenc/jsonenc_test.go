package jsonenc

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzString checks that String writes what encoding/json writes for every string: its quick
// paths and encoding/json differ in how they may escape, and what the gateway stores, and a
// transcript's strings become, are compared byte for byte (TestAgentMessages).
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "plain text", "quote \" backslash \\ slash /", "\b\f\n\r\t\x00\x01\x1f\x7f",
		"é 😀 \u00a0 \ufeff", "bad \xff\xfe utf-8 \xe2\x80", "<a href=\"x\">&amp;</a>", "line\u2028sep\u2029", "\xe2\x80\xa8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := String([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("String(%q) = %s, want %s", s, got[1:], want)
		}
	})
}

// TestTime compares Time with time.Time's MarshalJSON.
func TestTime(t *testing.T) {
	for _, tm := range []time.Time{{}, time.Date(2026, 12, 7, 17, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("", -5*3600)), time.Unix(0, 1).UTC()} {
		want, err := json.Marshal(tm)
		if err != nil {
			t.Fatal(err)
		}
		if got := Time(nil, tm); string(got) != string(want) {
			t.Errorf("Time(%v) = %s, want %s", tm, got, want)
		}
	}
}
