// Package jsonenc appends JSON values exactly as encoding/json's Marshal writes them, for the
// values the gateway writes on every turn (a thread's head, a run's metadata, a lease), whose
// encoding through reflection cost more than their storing.
package jsonenc

import (
	"encoding/json"
	"encoding/json/jsontext"
	"time"
)

// String appends s as encoding/json encodes a string. jsontext's minimal form is the same
// (since Go 1.22 encoding/json writes \b and \f short too, and both replace invalid UTF-8)
// but for the characters encoding/json escapes besides: <, > and & (for HTML), U+2028 and
// U+2029 (for JavaScript). A string holding one goes through encoding/json; the others,
// nearly all, are quoted by jsontext at a third of its cost, and a string of printable ASCII
// with nothing to escape (ids, roles, most short texts) is copied between quotes.
func String(b []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s); i++ {
		switch class[s[i]] {
		case escaped:
			plain = false
		case html:
			return marshal(b, s)
		case lead: // U+2028 and U+2029 are E2 80 A8 and E2 80 A9
			if i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9) {
				return marshal(b, s)
			}
			plain = false
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	b, _ = jsontext.AppendQuote(b, s)
	return b
}

func marshal(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		panic(err) // a string always encodes
	}
	return append(b, q...)
}

// What String makes of a byte of a string: copied (0), escaped or part of a multibyte
// character (escaped), escaped by encoding/json only (html), or the first byte of U+2028 or
// U+2029 (lead).
const (
	escaped = 1 + iota
	html
	lead
)

var class = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case c == '<' || c == '>' || c == '&':
			t[c] = html
		case c == 0xE2:
			t[c] = lead
		case c < 0x20 || c == '"' || c == '\\' || c >= 0x80:
			t[c] = escaped
		}
	}
	return t
}()

// Time appends t as its MarshalJSON writes it: RFC 3339 with nanoseconds, quoted (MarshalJSON
// refuses a year outside 0 to 9999, which no time the gateway writes has).
func Time(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// Slice appends s as a JSON array, null when nil (as encoding/json writes a nil slice), each
// element by elem.
func Slice[E any](b []byte, s []E, elem func(E, []byte) []byte) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, e := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(e, b)
	}
	return append(b, ']')
}
