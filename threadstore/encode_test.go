package threadstore

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/thread"
)

// TestThreadValueJSON holds appendJSON to json.Marshal's bytes, for thread values with every
// exported field set at random (a field added to a thread's types and not to appendJSON
// fails it), and for the zero value.
func TestThreadValueJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	values := []threadValue{{}}
	for range 2000 {
		var v threadValue
		fill(rng, reflect.ValueOf(&v).Elem(), 0)
		values = append(values, v)
	}
	for i, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("value %d: json.Marshal: %v", i, err)
		}
		got, err := v.appendJSON(nil)
		if err != nil {
			t.Fatalf("value %d: appendJSON: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("value %d:\nappendJSON   %s\njson.Marshal %s", i, got, want)
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
		v.SetInt(rng.Int64N(3) * rng.Int64N(1<<40))
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
	}
}

// BenchmarkThreadValueJSON encodes the value of a thread as its runs' acceptances and
// finishes write it: five runs, sixteen records named, a reply in the hot tail.
//
//	go test -run '^$' -bench ThreadValueJSON ./threadstore/
func BenchmarkThreadValueJSON(b *testing.B) {
	v := benchThreadValue()
	b.Run("appendJSON", func(b *testing.B) {
		for range b.N {
			if _, err := v.appendJSON(nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for range b.N {
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchThreadValue() threadValue {
	now := time.Date(2026, 12, 7, 17, 0, 0, 123456789, time.UTC)
	var v threadValue
	v.Principal, v.ThreadID, v.Title, v.Created, v.Updated = "user-42", "thread-7", "What the weather does", now, now
	for i := range 5 {
		v.Runs = append(v.Runs, ThreadRun{RunID: "run-" + string(rune('a'+i)), State: ThreadRunFinished, Started: now, Ended: now})
	}
	v.Transcript.Messages = []thread.Message{
		{ID: "m-user", Role: "user", Parts: []thread.Part{{Type: "text", Content: "And tomorrow?"}}},
		{ID: "m-reply", Role: "assistant", Parts: []thread.Part{{Type: "text", Content: strings.Repeat("sunny, then rain; ", 40)}}},
	}
	v.Sealed = &Sealed{Count: 64, Oldest: now}
	for i := range 16 {
		v.Sealed.Recent = append(v.Sealed.Recent, RecordRef{ID: "AbCdEfGh" + strconv.Itoa(i), N: 1, From: 2 * i, Count: 2, Bytes: 900})
	}
	for i := range newestSealed {
		v.Sealed.Newest = append(v.Sealed.Newest, SealedID{ID: "m-" + strconv.Itoa(i), Role: "assistant"})
	}
	return v
}
