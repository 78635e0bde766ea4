package protocol

import (
	"errors"
	"fmt"
	"strconv"
)

// errNotObject reports JSON that is not an object where Fields wants one.
var errNotObject = errors.New("protocol: not a JSON object")

// Fields is a JSON object split into its top-level members, the values left encoded, for a
// client that reads many frames and needs a few fields of each (a load generator, a
// monitor). Parse reuses the memory of the previous parse, so a stream of frames of similar
// sizes is read without allocating, where encoding/json would decode every field. The zero
// value is ready to use. A Fields is not safe for concurrent use.
type Fields struct {
	raw []byte   // the buffer Parse compacts into
	m   []member // the members, referencing raw (or, after Object, the parent's raw)
}

// Parse checks that data is exactly one JSON value, an object, and splits it. It returns an
// error wrapping ErrNotJSON when data is not JSON, and an error when it is JSON but not an
// object; f is then empty.
func (f *Fields) Parse(data []byte) error {
	raw, err := compactJSON(f.raw[:0], data)
	f.raw, f.m = raw, f.m[:0]
	if err != nil {
		return err
	}
	if !isObject(raw) {
		return fmt.Errorf("%w: received %s", errNotObject, kindOf(raw))
	}
	f.m = splitObject(raw, f.m)
	return nil
}

// Object splits the object value of key into dst (which may be f), without copying it:
// dst's values alias f's memory until f's next Parse. It reports false, leaving dst empty,
// when key is absent or its value is not an object.
func (f *Fields) Object(key string, dst *Fields) bool {
	v := lookup(f.m, key)
	dst.m = dst.m[:0]
	if !isObject(v) {
		return false
	}
	dst.m = splitObject(v, dst.m)
	return true
}

// Raw returns the compact encoding of the value of key, nil when key is absent. Like
// JSON.parse, the last of duplicate keys wins. The slice aliases f's memory: it is valid
// until the next Parse and must not be modified.
func (f *Fields) Raw(key string) []byte { return lookup(f.m, key) }

// Str returns the value of key decoded, "" when key is absent or its value is not a string.
// The value of "type" is one of the EventType constants when it names an AG-UI type, without
// allocating.
func (f *Fields) Str(key string) string {
	v := lookup(f.m, key)
	switch {
	case !isString(v):
		return ""
	case key == "type":
		return string(internType(v))
	}
	return unquote(v)
}

// Number returns the value of key when it is a JSON number (as float64, the way JSON.parse
// reads it), and false when key is absent or its value is not a number.
func (f *Fields) Number(key string) (float64, bool) {
	v := lookup(f.m, key)
	if kindOf(v) != "number" {
		return 0, false
	}
	n, _ := strconv.ParseFloat(string(v), 64) // beyond float64: ±Inf, as JSON.parse
	return n, true
}
