// Package jsonenctest holds an encoder of the jsonenc kind to encoding/json's bytes, in tests.
package jsonenctest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Check compares enc with json.Marshal on the zero T and on 2,000 values of T with every
// exported field set at random, recursively: a field added to T and not to enc fails it.
func Check[T any](t *testing.T, enc func(T) ([]byte, error)) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	values := make([]T, 1, 2001)
	for range 2000 {
		var v T
		fill(rng, reflect.ValueOf(&v).Elem(), 0)
		values = append(values, v)
	}
	for i, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("value %d: json.Marshal: %v", i, err)
		}
		got, err := enc(v)
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("value %d:\nencoder      %s\njson.Marshal %s", i, got, want)
		}
	}
}

// Strings and raw values fill draws from: escapes of every kind, HTML characters, the
// JavaScript line separators, invalid UTF-8.
var (
	fillStrings = []string{"", "a", "run-1", `q"b\s`, "<&>", "line\u2028sep\u2029", "tab\tnl\n\x01", "é✓😀", "\xff\xfe", "x/y"}
	fillRaws    = []string{`{}`, `{"a":1}`, `[1,"x",null]`, `"s"`, `true`, `3.5`}
)

// fill sets every exported field of v, recursively, at random.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	switch v.Type() {
	case reflect.TypeFor[time.Time]():
		if rng.IntN(5) > 0 {
			loc := time.UTC
			if rng.IntN(3) == 0 {
				loc = time.FixedZone("", 3600*rng.IntN(12))
			}
			v.Set(reflect.ValueOf(time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(loc)))
		}
		return
	case reflect.TypeFor[json.RawMessage]():
		if rng.IntN(3) > 0 {
			v.SetBytes([]byte(fillRaws[rng.IntN(len(fillRaws))]))
		}
		return
	}
	switch v.Kind() {
	case reflect.String:
		s := fillStrings[rng.IntN(len(fillStrings))]
		if rng.IntN(4) == 0 {
			s += string(rune(rng.IntN(0x3000)))
		}
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		v.SetInt(rng.Int64N(3) * rng.Int64N(1<<40) * (1 - 2*rng.Int64N(2)))
	case reflect.Uint64:
		v.SetUint(rng.Uint64N(3) * rng.Uint64N(1<<62))
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Pointer:
		if depth < 6 && rng.IntN(3) > 0 {
			v.Set(reflect.New(v.Type().Elem()))
			fill(rng, v.Elem(), depth+1)
		}
	case reflect.Slice:
		if depth >= 6 || rng.IntN(4) == 0 {
			return // nil
		}
		n := rng.IntN(4)
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			fill(rng, v.Index(i), depth+1)
		}
	case reflect.Map:
		if depth >= 6 || rng.IntN(3) == 0 {
			return
		}
		v.Set(reflect.MakeMap(v.Type()))
		for range rng.IntN(3) {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(rng, k, depth+1)
			fill(rng, e, depth+1)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(rng, v.Field(i), depth+1)
			}
		}
	default:
		panic("jsonenctest: no values for " + v.Type().String())
	}
}
