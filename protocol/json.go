package protocol

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// member is one key/value pair of an encoded JSON object. val references the
// compact encoding it was split from.
type member struct {
	key string
	val []byte
	tok []byte // the key as encoded in the input, nil for built members
}

// mem builds a member that was not split from an input.
func mem(key string, val []byte) member { return member{key: key, val: val} }

// The helpers below work on compact, valid JSON (the output of json.Compact):
// no insignificant whitespace, every token well formed.

// skipString returns the length of the JSON string token at the start of b.
func skipString(b []byte) int {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the length of the JSON value at the start of b.
func skipValue(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	switch b[0] {
	case '"':
		return skipString(b)
	case '{', '[':
		depth := 0
		for i := 0; i < len(b); i++ {
			switch b[i] {
			case '"':
				i += skipString(b[i:]) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default:
		for i := 0; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']':
				return i
			}
		}
		return len(b)
	}
}

// splitObject appends the members of the JSON object b to dst.
func splitObject(b []byte, dst []member) []member {
	if len(b) < 2 || b[0] != '{' {
		return dst
	}
	i := 1
	for i < len(b) && b[i] != '}' {
		n := skipString(b[i:])
		tok := b[i : i+n]
		i += n + 1 // the colon
		v := skipValue(b[i:])
		dst = append(dst, member{key: internKey(tok), val: b[i : i+v], tok: tok})
		i += v
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
	return dst
}

// splitArray appends the elements of the JSON array b to dst.
func splitArray(b []byte, dst [][]byte) [][]byte {
	if len(b) < 2 || b[0] != '[' {
		return dst
	}
	i := 1
	for i < len(b) && b[i] != ']' {
		v := skipValue(b[i:])
		dst = append(dst, b[i:i+v])
		i += v
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
	return dst
}

// lookup returns the value of key in ms, nil when absent. Like JSON.parse, the
// last of duplicate keys wins.
func lookup(ms []member, key string) []byte {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].key == key {
			return ms[i].val
		}
	}
	return nil
}

// internKey returns the key of a JSON string token, without allocating for
// the keys the protocol declares.
func internKey(tok []byte) string {
	body := tok[1 : len(tok)-1]
	switch string(body) {
	case "type":
		return "type"
	case "messageId":
		return "messageId"
	case "delta":
		return "delta"
	case "subagentRunId":
		return "subagentRunId"
	case "toolCallId":
		return "toolCallId"
	case "toolCallName":
		return "toolCallName"
	case "parentMessageId":
		return "parentMessageId"
	case "role":
		return "role"
	case "name":
		return "name"
	case "timestamp":
		return "timestamp"
	case "rawEvent":
		return "rawEvent"
	case "metadata":
		return "metadata"
	case "threadId":
		return "threadId"
	case "runId":
		return "runId"
	case "id":
		return "id"
	case "content":
		return "content"
	}
	return unquote(tok)
}

// unquote decodes a JSON string token.
func unquote(tok []byte) string {
	if len(tok) < 2 || tok[0] != '"' {
		return ""
	}
	body := tok[1 : len(tok)-1]
	simple, ascii := true, true
	for _, c := range body {
		if c == '\\' {
			simple = false
			break
		}
		ascii = ascii && c < utf8.RuneSelf
	}
	if simple && (ascii || utf8.Valid(body)) {
		return string(body)
	}
	return string(unescape(body))
}

// unescape decodes the escapes of a JSON string body, and replaces bytes that are not
// UTF-8 with U+FFFD as encoding/json does (appendString writes them so). Unlike
// encoding/json it keeps a lone surrogate distinct from U+FFFD (as a JavaScript string
// does) by encoding it as its three-byte generalized UTF-8 form, so ids that differ in
// JavaScript differ here too.
func unescape(body []byte) []byte {
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(body[i:])
			switch {
			case r != utf8.RuneError || size > 1:
				out = append(out, body[i:i+size]...)
			case isSurrogate(body[i:]):
				out, size = append(out, body[i:i+3]...), 3
			default:
				out = utf8.AppendRune(out, utf8.RuneError)
			}
			i += size - 1
			continue
		}
		if c != '\\' || i+1 >= len(body) {
			out = append(out, c)
			continue
		}
		i++
		switch body[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(body[i+1:])
			if !ok {
				out = append(out, '\\', 'u')
				continue
			}
			i += 4
			if r >= 0xD800 && r < 0xDC00 && i+6 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
				if lo, ok := hex4(body[i+3:]); ok && lo >= 0xDC00 && lo < 0xE000 {
					out = utf8.AppendRune(out, 0x10000+(r-0xD800)<<10+(lo-0xDC00))
					i += 6
					continue
				}
			}
			if r >= 0xD800 && r < 0xE000 {
				out = append(out, byte(0xE0|r>>12), byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
				continue
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, body[i])
		}
	}
	return out
}

// isSurrogate reports whether b starts with a lone surrogate in generalized UTF-8 (the form
// unescape keeps, and appendString writes back as \udXXX).
func isSurrogate[T string | []byte](b T) bool {
	return len(b) >= 3 && b[0] == 0xED && b[1] >= 0xA0 && b[1] <= 0xBF && b[2]&0xC0 == 0x80
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// kindOf names the JSON type of v the way zod reports a received value; nil
// is an absent value.
func kindOf(v []byte) string {
	if v == nil {
		return "undefined"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func isNull(v []byte) bool   { return len(v) == 4 && v[0] == 'n' }
func isString(v []byte) bool { return len(v) > 0 && v[0] == '"' }
func isObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }
func isArray(v []byte) bool  { return len(v) > 0 && v[0] == '[' }

// appendString appends s as a JSON string, escaping like JSON.stringify.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			if c < utf8.RuneSelf {
				i++
				continue
			}
			if isSurrogate(s[i:]) {
				// A lone surrogate kept by unescape: JSON.stringify writes \udXXX.
				dst = append(dst, s[start:i]...)
				dst = append(dst, '\\', 'u', 'd', hex[s[i+1]>>2&0xF], hex[(s[i+1]&0x3)<<2|s[i+2]>>4&0x3], hex[s[i+2]&0xF])
				i += 3
				start = i
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendObject encodes ms as a JSON object.
func appendObject(dst []byte, ms []member) []byte {
	dst = append(dst, '{')
	for i, m := range ms {
		if i > 0 {
			dst = append(dst, ',')
		}
		if m.tok != nil {
			dst = append(dst, m.tok...)
		} else {
			dst = appendString(dst, m.key)
		}
		dst = append(dst, ':')
		dst = append(dst, m.val...)
	}
	return append(dst, '}')
}

// jsText renders a JSON value the way a JavaScript template literal would
// interpolate it, for error messages.
func jsText(v []byte) string {
	switch {
	case v == nil:
		return "undefined"
	case isString(v):
		return unquote(v)
	case isObject(v):
		return "[object Object]"
	case isArray(v):
		var parts [][]byte
		parts = splitArray(v, parts)
		s := ""
		for i, p := range parts {
			if i > 0 {
				s += ","
			}
			if !isNull(p) {
				s += jsText(p)
			}
		}
		return s
	}
	if kindOf(v) == "number" {
		f, _ := strconv.ParseFloat(string(v), 64)
		return jsNumber(f)
	}
	return string(v)
}

// jsNumber formats f like JavaScript's Number.prototype.toString.
func jsNumber(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0:
		return "0"
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddddde±XX
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1 // n: position of the decimal point
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	es := "+"
	if n-1 < 0 {
		es = "-"
	}
	m := digits[:1]
	if k > 1 {
		m += "." + digits[1:]
	}
	return sign + m + "e" + es + strconv.Itoa(abs(n-1))
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
