package sse

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// readAll returns every event of r and the error that ended it (nil for io.EOF).
func readAll(r *Reader) ([]Event, error) {
	var out []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}

func TestReader(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []Event
	}{
		{"one event", "data: {\"a\":1}\n\n", []Event{{Data: `{"a":1}`}}},
		{"no space after colon", "data:x\n\n", []Event{{Data: "x"}}},
		{"only the first space is removed", "data:  x\n\n", []Event{{Data: " x"}}},
		{"multi-line data", "data: a\ndata: b\ndata:\n\n", []Event{{Data: "a\nb\n"}}},
		{"CRLF", "data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", []Event{{Data: "a\nb"}, {Data: "c"}}},
		{"CR", "data: a\r\rdata: b\r\r", []Event{{Data: "a"}, {Data: "b"}}},
		{"comments", ": keep-alive\n\n:x\ndata: a\n: between\ndata: b\n\n", []Event{{Data: "a\nb"}}},
		{"event type and id", "event: message\nid: 7\ndata: a\n\ndata: b\n\n", []Event{{Type: "message", ID: "7", Data: "a"}, {ID: "7", Data: "b"}}},
		{"no data, not dispatched", "event: x\nid: 1\n\n\n\ndata: y\n\n", []Event{{ID: "1", Data: "y"}}},
		{"field without colon", "data\n\n", []Event{{Data: ""}}},
		{"unknown fields and retry ignored", "retry: 10\nfoo: bar\ndata: a\n\n", []Event{{Data: "a"}}},
		{"BOM", "\uFEFFdata: a\n\n", []Event{{Data: "a"}}},
		{"unterminated last event dropped", "data: a\n\ndata: b\n", []Event{{Data: "a"}}},
		{"unterminated last line dropped", "data: a\n\ndata: b", []Event{{Data: "a"}}},
		{"empty stream", "", nil},
		{"utf-8 data", "data: {\"d\":\"héllo – 世界\"}\n\n", []Event{{Data: `{"d":"héllo – 世界"}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			readers := map[string]io.Reader{
				"whole":    strings.NewReader(tt.input),
				"one byte": iotest.OneByteReader(strings.NewReader(tt.input)),
				"halves":   io.MultiReader(strings.NewReader(tt.input[:len(tt.input)/2]), strings.NewReader(tt.input[len(tt.input)/2:])),
			}
			for how, src := range readers {
				got, err := readAll(NewReader(src, 0))
				if err != nil || !reflect.DeepEqual(got, tt.want) {
					t.Errorf("read %q (%s) = %+v, %v; want %+v", tt.input, how, got, err, tt.want)
				}
			}
		})
	}
}

func TestReaderTooLarge(t *testing.T) {
	tests := []struct {
		name  string
		input string
		max   int
		want  []Event // before the error
	}{
		{"one line", "data: 0123456789\n\n", 9, nil},
		{"many lines", "data: 01234\ndata: 56789\n\n", 10, nil}, // 11 bytes with the newline
		{"a line without end", "data: ok\n\n" + strings.Repeat("x", 100), 20, []Event{{Data: "ok"}}},
		{"a long comment", ":" + strings.Repeat("x", 100) + "\n", 20, nil},
	}
	for _, tt := range tests {
		got, err := readAll(NewReader(strings.NewReader(tt.input), tt.max))
		if !errors.Is(err, ErrTooLarge) || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: read = %+v, %v; want %+v, ErrTooLarge", tt.name, got, err, tt.want)
		}
	}
	// Exactly at the limit passes.
	got, err := readAll(NewReader(strings.NewReader("data: 0123456789\n\n"), 10))
	if err != nil || len(got) != 1 || got[0].Data != "0123456789" {
		t.Errorf("read an event of exactly the limit = %+v, %v", got, err)
	}
}

func TestExcerpt(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456789…"},
		{"a\n\n  b\tc\r\n", 20, "a b c"},
		{"ééééé", 5, "éé…"}, // a cut rune is dropped
		{"bad \xff byte", 20, "bad \uFFFD byte"},
	}
	for _, tt := range tests {
		if got := Excerpt([]byte(tt.in), tt.n); got != tt.want {
			t.Errorf("Excerpt(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// FuzzReader checks that how the stream is split across reads never changes its events.
func FuzzReader(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data: a\r\ndata: b\r\n\r\n", ":c\rdata:x\r\r", "\uFEFFevent: e\nid: 1\ndata\n\n"} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, s string, cut uint8) {
		whole, werr := readAll(NewReader(strings.NewReader(s), 64))
		i := int(cut) % (len(s) + 1)
		split, serr := readAll(NewReader(io.MultiReader(strings.NewReader(s[:i]), iotest.OneByteReader(strings.NewReader(s[i:]))), 64))
		if !reflect.DeepEqual(whole, split) || (werr == nil) != (serr == nil) {
			t.Fatalf("events of %q: whole %+v (%v), split at %d %+v (%v)", s, whole, werr, i, split, serr)
		}
		for _, ev := range whole {
			if len(ev.Data) > 64 {
				t.Fatalf("event of %d bytes passed a limit of 64", len(ev.Data))
			}
		}
	})
}
