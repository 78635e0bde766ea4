package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"unicode/utf8"
)

func TestFields(t *testing.T) {
	var f, chunk Fields
	frame := []byte(` {"id": "7-1", "chunk": {"type": "TEXT_MESSAGE_CONTENT", "messageId":"m\"1",` +
		` "delta":"t1 \u00e9\n", "timestamp": 1764471296123, "n": -1.5e3, "delta2": null}, "id":"7-2"} `)
	if err := f.Parse(frame); err != nil {
		t.Fatal(err)
	}
	if got := f.Str("id"); got != "7-2" {
		t.Errorf(`Str("id") = %q, want the last of the duplicates, "7-2"`, got)
	}
	if got := string(f.Raw("chunk")); got[0] != '{' || got[len(got)-1] != '}' || len(got) == 0 {
		t.Errorf(`Raw("chunk") = %s, want the compact object`, got)
	}
	if f.Raw("type") != nil || f.Str("type") != "" {
		t.Errorf(`an absent key: Raw %q, Str %q; want nil and ""`, f.Raw("type"), f.Str("type"))
	}
	if !f.Object("chunk", &chunk) {
		t.Fatal(`Object("chunk") = false`)
	}
	for key, want := range map[string]string{"type": "TEXT_MESSAGE_CONTENT", "messageId": `m"1`, "delta": "t1 é\n", "timestamp": "", "delta2": "", "nope": ""} {
		if got := chunk.Str(key); got != want {
			t.Errorf("Str(%q) = %q, want %q", key, got, want)
		}
	}
	if got := chunk.Str("type"); got != string(TextMessageContent) {
		t.Errorf("type = %q", got)
	}
	for key, want := range map[string]float64{"timestamp": 1764471296123, "n": -1500} {
		if got, ok := chunk.Number(key); !ok || got != want {
			t.Errorf("Number(%q) = %v, %v; want %v", key, got, ok, want)
		}
	}
	for _, key := range []string{"delta", "delta2", "nope"} {
		if got, ok := chunk.Number(key); ok {
			t.Errorf("Number(%q) = %v, true; want false for a value that is not a number", key, got)
		}
	}
	if f.Object("id", &chunk) || chunk.Raw("type") != nil {
		t.Error(`Object("id") of a string: want false and an empty dst`)
	}
	if !f.Object("chunk", &f) || f.Str("delta") != "t1 é\n" || f.Raw("id") != nil {
		t.Errorf(`Object("chunk", itself): want f to become the chunk, delta %q id %s`, f.Str("delta"), f.Raw("id"))
	}

	// A later Parse replaces the members, also when it fails.
	if err := f.Parse([]byte(`{"id":"8"}`)); err != nil || f.Str("id") != "8" || f.Raw("chunk") != nil {
		t.Errorf(`second Parse: %v, id %q, chunk %s`, err, f.Str("id"), f.Raw("chunk"))
	}
	for _, bad := range []string{``, `{"id":"1"`, `{"id":"1"} x`, `{"id":1,}`, `{'id':1}`} {
		if err := f.Parse([]byte(bad)); !errors.Is(err, ErrNotJSON) {
			t.Errorf("Parse(%q) = %v, want ErrNotJSON", bad, err)
		}
		if f.Raw("id") != nil {
			t.Errorf("after Parse(%q) failed, Raw(id) = %s, want nil", bad, f.Raw("id"))
		}
	}
	for _, bad := range []string{`[]`, `"x"`, `1`, `null`} {
		if err := f.Parse([]byte(bad)); err == nil || errors.Is(err, ErrNotJSON) {
			t.Errorf("Parse(%q) = %v, want a not-an-object error", bad, err)
		}
	}
	if err := f.Parse([]byte(`{"t":1e999}`)); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.Number("t"); !ok || !math.IsInf(got, 1) {
		t.Errorf("Number of 1e999 = %v, %v; want +Inf as JSON.parse", got, ok)
	}
}

// TestFieldsReuse checks the point of Fields: once warm, reading the fields a client needs
// from a frame allocates nothing but the strings it asks for that are not event types.
func TestFieldsReuse(t *testing.T) {
	frame := []byte(`{"id":"000001-000000000003-0002","chunk":{"type":"TEXT_MESSAGE_CONTENT","messageId":"r.msg1","delta":"t1 ","timestamp":1764471296123}}`)
	var f, chunk Fields
	allocs := testing.AllocsPerRun(100, func() {
		if err := f.Parse(frame); err != nil || !f.Object("chunk", &chunk) {
			t.Fatal(err)
		}
		if chunk.Str("type") != string(TextMessageContent) || chunk.Raw("delta") == nil || chunk.Str("name") != "" {
			t.Fatal("wrong fields")
		}
		if _, ok := chunk.Number("timestamp"); !ok {
			t.Fatal("no timestamp")
		}
	})
	// One allocation: splitObject's key of "chunk", which is not an event key.
	if allocs > 1 {
		t.Errorf("Parse, Object, Str(type), Raw, Number: %v allocations per frame, want at most 1", allocs)
	}
}

// FuzzFields checks Fields against encoding/json: Parse accepts exactly the JSON objects, and
// reads the same top-level strings and numbers (for ASCII input, where the two agree on every
// escape).
func FuzzFields(f *testing.F) {
	for _, s := range []string{
		`{"id":"1","chunk":{"type":"RUN_STARTED"}}`, ` { "a" : [1, {"b":"}"}], "c":"\"\\u0041", "d":-0.5e-3 } `,
		`{"a":1,"a":"2"}`, `{"a\u0062":true}`, `[]`, `{"a":}`, `{"a":1}}`, `{"a":"\x01"}`, `{"t":1e999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fs Fields
		err := fs.Parse(data)
		object := json.Valid(data) && bytes.TrimLeft(data, " \t\r\n")[0] == '{'
		if (err == nil) != object {
			t.Fatalf("Parse(%q) = %v, want an error iff not a JSON object", data, err)
		}
		var want map[string]any
		if err != nil || json.Unmarshal(data, &want) != nil { // a number beyond float64
			return
		}
		for _, c := range data {
			if c >= utf8.RuneSelf {
				return
			}
		}
		for k, v := range want {
			switch v := v.(type) {
			case string:
				if got := fs.Str(k); got != v {
					t.Errorf("Str(%q) = %q, encoding/json %q in %q", k, got, v, data)
				}
			case float64:
				if got, ok := fs.Number(k); !ok || got != v {
					t.Errorf("Number(%q) = %v, %v; encoding/json %v in %q", k, got, ok, v, data)
				}
			}
		}
	})
}
