// Package jsoncompact validates and compacts JSON text in one pass: it decides and writes
// what encoding/json's Compact does, several times faster on long strings, which
// json.Compact's scanner takes a function call per byte for. The AG-UI event decoder and
// the Durable Streams JSON-mode appends both run every body through it.
package jsoncompact

// MaxDepth is the deepest nesting of arrays and objects Append accepts, as encoding/json.
const MaxDepth = 10000

// Append appends to dst the JSON text src without its insignificant whitespace and reports
// whether src is exactly one valid JSON value; when it is not, dst is returned as it was
// given. It accepts and writes what json.Compact does: strings are not checked for valid
// UTF-8 (bytes from 0x80 up pass through as they are), nor escaped for HTML. It makes one
// pass that copies runs of bytes and skips through strings a byte per step.
func Append(dst, src []byte) ([]byte, bool) {
	c := compactor{src: src, dst: dst}
	c.space()
	if !c.value(0) {
		return dst, false
	}
	c.space()
	if c.i != len(src) {
		return dst, false
	}
	c.dst = append(c.dst, src[c.run:]...)
	return c.dst, true
}

// compactor is Append's state: src[run:i] is scanned and not copied to dst yet.
type compactor struct {
	src, dst []byte
	i, run   int
}

// plain marks the bytes a string holds as they are: not a quote, a backslash or a control
// character.
var plain = func() (t [256]bool) {
	for b := 0x20; b < 256; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

func isHex(b byte) bool { return isDigit(b) || ('a' <= b && b <= 'f') || ('A' <= b && b <= 'F') }

// space skips whitespace, copying the scanned bytes before it.
func (c *compactor) space() {
	if c.i < len(c.src) && isSpace(c.src[c.i]) {
		c.dst = append(c.dst, c.src[c.run:c.i]...)
		for c.i++; c.i < len(c.src) && isSpace(c.src[c.i]); c.i++ {
		}
		c.run = c.i
	}
}

// at reports whether the next byte is b.
func (c *compactor) at(b byte) bool { return c.i < len(c.src) && c.src[c.i] == b }

// value scans one value inside depth arrays or objects.
func (c *compactor) value(depth int) bool {
	if c.i >= len(c.src) {
		return false
	}
	switch c.src[c.i] {
	case '{':
		return c.container(depth, '}', true)
	case '[':
		return c.container(depth, ']', false)
	case '"':
		return c.str()
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	}
	return c.number()
}

// container scans an object (keyed) or an array from its opening byte to end.
func (c *compactor) container(depth int, end byte, keyed bool) bool {
	if depth >= MaxDepth {
		return false
	}
	c.i++
	c.space()
	if c.at(end) {
		c.i++
		return true
	}
	for {
		if keyed {
			if !c.at('"') || !c.str() {
				return false
			}
			c.space()
			if !c.at(':') {
				return false
			}
			c.i++
			c.space()
		}
		if !c.value(depth + 1) {
			return false
		}
		c.space()
		switch {
		case c.at(','):
			c.i++
			c.space()
		case c.at(end):
			c.i++
			return true
		default:
			return false
		}
	}
}

// str scans a string from its opening quote.
func (c *compactor) str() bool {
	s, i := c.src, c.i+1
	for {
		for i < len(s) && plain[s[i]] {
			i++
		}
		if i >= len(s) || s[i] < 0x20 {
			return false
		}
		if s[i] == '"' {
			c.i = i + 1
			return true
		}
		// A backslash.
		if i++; i >= len(s) {
			return false
		}
		switch s[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if len(s)-i < 5 || !isHex(s[i+1]) || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) {
				return false
			}
			i += 5
		default:
			return false
		}
	}
}

func (c *compactor) literal(lit string) bool {
	if len(c.src)-c.i < len(lit) || string(c.src[c.i:c.i+len(lit)]) != lit {
		return false
	}
	c.i += len(lit)
	return true
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *compactor) number() bool {
	s, i := c.src, c.i
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		for i++; i < len(s) && isDigit(s[i]); i++ {
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		if i++; i >= len(s) || !isDigit(s[i]) {
			return false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		if i++; i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || !isDigit(s[i]) {
			return false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	c.i = i
	return true
}
