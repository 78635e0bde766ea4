package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// compactJSON appends src to dst without insignificant whitespace, checking
// that src is exactly one JSON value. It is the hot path of every decode; on
// invalid input it defers to encoding/json for the error text.
func compactJSON(dst, src []byte) ([]byte, error) {
	c := compactor{src: src, dst: dst}
	c.ws()
	if c.value(0) {
		c.ws()
		if c.i == len(src) {
			return c.dst, nil
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, src); err != nil {
		return dst, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	// encoding/json accepts what the fast path refused (deep nesting).
	return append(dst, buf.Bytes()...), nil
}

const maxDepth = 10000

type compactor struct {
	src []byte
	dst []byte
	i   int
}

func (c *compactor) ws() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *compactor) value(depth int) bool {
	if c.i >= len(c.src) || depth > maxDepth {
		return false
	}
	switch b := c.src[c.i]; {
	case b == '"':
		return c.str()
	case b == '{':
		c.dst = append(c.dst, '{')
		c.i++
		c.ws()
		if c.i < len(c.src) && c.src[c.i] == '}' {
			c.dst = append(c.dst, '}')
			c.i++
			return true
		}
		for {
			if c.i >= len(c.src) || c.src[c.i] != '"' || !c.str() {
				return false
			}
			c.ws()
			if c.i >= len(c.src) || c.src[c.i] != ':' {
				return false
			}
			c.dst = append(c.dst, ':')
			c.i++
			c.ws()
			if !c.value(depth + 1) {
				return false
			}
			c.ws()
			if c.i >= len(c.src) {
				return false
			}
			switch c.src[c.i] {
			case ',':
				c.dst = append(c.dst, ',')
				c.i++
				c.ws()
			case '}':
				c.dst = append(c.dst, '}')
				c.i++
				return true
			default:
				return false
			}
		}
	case b == '[':
		c.dst = append(c.dst, '[')
		c.i++
		c.ws()
		if c.i < len(c.src) && c.src[c.i] == ']' {
			c.dst = append(c.dst, ']')
			c.i++
			return true
		}
		for {
			if !c.value(depth + 1) {
				return false
			}
			c.ws()
			if c.i >= len(c.src) {
				return false
			}
			switch c.src[c.i] {
			case ',':
				c.dst = append(c.dst, ',')
				c.i++
				c.ws()
			case ']':
				c.dst = append(c.dst, ']')
				c.i++
				return true
			default:
				return false
			}
		}
	case b == 't':
		return c.lit("true")
	case b == 'f':
		return c.lit("false")
	case b == 'n':
		return c.lit("null")
	case b == '-' || (b >= '0' && b <= '9'):
		return c.num()
	}
	return false
}

func (c *compactor) lit(s string) bool {
	if len(c.src)-c.i < len(s) || string(c.src[c.i:c.i+len(s)]) != s {
		return false
	}
	c.dst = append(c.dst, s...)
	c.i += len(s)
	return true
}

func (c *compactor) str() bool {
	start := c.i
	i := c.i + 1
	for i < len(c.src) {
		b := c.src[i]
		switch {
		case b == '"':
			i++
			c.dst = append(c.dst, c.src[start:i]...)
			c.i = i
			return true
		case b < 0x20:
			return false
		case b == '\\':
			if i+1 >= len(c.src) {
				return false
			}
			switch c.src[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(c.src) {
					return false
				}
				for _, h := range c.src[i+2 : i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				i += 6
			default:
				return false
			}
		default:
			i++
		}
	}
	return false
}

func (c *compactor) num() bool {
	s, i := c.src, c.i
	digits := func() bool {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if !digits() {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	c.dst = append(c.dst, s[c.i:i]...)
	c.i = i
	return true
}
