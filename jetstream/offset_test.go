package jetstream

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestOffsetRoundTrip(t *testing.T) {
	tag := offsetTag("epoch", logKey("alice", "run"))
	tests := []position{
		{gen: 1, seq: 1, idx: 0, tag: tag},
		{gen: 0xffffff, seq: 0xffffffffffff, idx: maxBatchEvents - 1, tag: tag},
		{gen: 7, seq: 123456, idx: 42, tag: tag},
	}
	for _, p := range tests {
		s := p.String()
		if len(s) != offsetLen || strings.ContainsAny(s, " \t\r\n\x00") {
			t.Errorf("position %+v formats as %q", p, s)
		}
		got, err := parseOffset(s)
		if err != nil || got != p {
			t.Errorf("parseOffset(%q) = %+v, %v; want %+v", s, got, err, p)
		}
	}
	a := position{gen: 1, seq: 9, idx: 3, tag: tag}.String()
	b := position{gen: 1, seq: 10, idx: 0, tag: tag}.String()
	if a >= b {
		t.Errorf("offset %q does not sort before %q", a, b)
	}
}

func TestOffsetFormat(t *testing.T) {
	tag := offsetTag("epoch", logKey("alice", "run"))
	tests := []struct {
		p    position
		want string
	}{
		{position{gen: 1, seq: 1, idx: 0, tag: tag}, "000001-000000000001-0000-" + tag},
		{position{gen: 0xabcdef, seq: 0x123456789abc, idx: 0xfedc, tag: tag}, "abcdef-123456789abc-fedc-" + tag},
		{position{gen: 0xffffff, seq: 0xffffffffffff, idx: 0xffff, tag: tag}, "ffffff-ffffffffffff-ffff-" + tag},
		// Over-wide fields format at full width: parseOffset refuses them below.
		{position{gen: 0x1000000, seq: 1, tag: tag}, "1000000-000000000001-0000-" + tag},
		{position{gen: 1, seq: 0x1000000000000, tag: tag}, "000001-1000000000000-0000-" + tag},
		{position{gen: 1, seq: 1, idx: maxBatchEvents, tag: tag}, "000001-000000000001-10000-" + tag},
		{position{gen: 1, seq: 1, tag: tag[:11]}, "000001-000000000001-0000-" + tag[:11]},
	}
	for _, tt := range tests {
		got := tt.p.String()
		if got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.p, got, tt.want)
		}
		if len(got) != offsetLen {
			if _, err := parseOffset(got); !errors.Is(err, ErrInvalidOffset) {
				t.Errorf("parseOffset(%q) of an over-wide position = %v, want ErrInvalidOffset", got, err)
			}
		}
	}
}

func BenchmarkOffsetString(b *testing.B) {
	p := position{gen: 3, seq: 123456, idx: 42, tag: offsetTag("epoch", logKey("alice", "run"))}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.String()
	}
}

func TestParseOffsetRefuses(t *testing.T) {
	good := position{gen: 1, seq: 2, idx: 3, tag: offsetTag("e", "k")}.String()
	tests := []string{
		"", "-1", "now", "0", good[:len(good)-1], good + "0", strings.ToUpper(good),
		strings.Replace(good, "-", "_", 1), position{gen: 0, seq: 2, tag: "000000000000"}.String(),
		position{gen: 1, seq: 0, tag: "000000000000"}.String(), " " + good[1:], "+" + good[1:],
	}
	for _, s := range tests {
		if p, err := parseOffset(s); !errors.Is(err, ErrInvalidOffset) {
			t.Errorf("parseOffset(%q) = %+v, %v; want ErrInvalidOffset", s, p, err)
		}
	}
}

func TestSubjectKeys(t *testing.T) {
	pairs := [][2]string{{"a", "bc"}, {"ab", "c"}, {"", "abc"}, {"abc", ""}, {"a.b", "*"}, {"a", ">"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := logKey(p[0], p[1])
		if prev, ok := seen[k]; ok {
			t.Errorf("logKey%q = logKey%q", p, prev)
		}
		seen[k] = p
		for _, c := range k {
			if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
				t.Fatalf("logKey%q = %q has %q", p, k, c)
			}
		}
	}
}

func FuzzParseOffset(f *testing.F) {
	f.Add(position{gen: 1, seq: 2, idx: 3, tag: offsetTag("e", "k")}.String())
	f.Add("-1")
	f.Add("000001-00000000000a-0000-")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseOffset(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("parseOffset(%q) = %+v, which formats as %q", s, p, p.String())
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(encodeBatch(nil, [][]byte{[]byte(`{"type":"RUN_STARTED"}`), nil, []byte("x")}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := decodeBatch(body)
		if err != nil {
			return
		}
		if again := encodeBatch(nil, events); !bytes.Equal(again, body) {
			// Uvarints have one canonical form only when minimal; decodeBatch accepts
			// padded ones, so compare the decoded events instead.
			back, err := decodeBatch(again)
			if err != nil || len(back) != len(events) {
				t.Fatalf("re-encoding %x gives %x (%v)", body, again, err)
			}
			for i := range back {
				if !bytes.Equal(back[i], events[i]) {
					t.Fatalf("event %d changed on re-encoding", i)
				}
			}
		}
	})
}
