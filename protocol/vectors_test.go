package protocol

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// agVector is one entry of testdata/agui-vectors.json.
type agVector struct {
	Name        string            `json:"name"`
	Section     string            `json:"section"`
	Upgrade     bool              `json:"upgrade"`
	SkipSchema  bool              `json:"skipSchema"`
	Events      []json.RawMessage `json:"events"`
	Accept      []json.RawMessage `json:"accept"`
	Reject      string            `json:"reject"`
	SchemaError *struct {
		Index   int    `json:"index"`
		Path    string `json:"path"`
		Message string `json:"message"`
	} `json:"schemaError"`
}

func loadAGVectors(tb testing.TB) []agVector {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "agui-vectors.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var file struct {
		Vectors []agVector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		tb.Fatal(err)
	}
	return file.Vectors
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// placeholders maps "<uuidN>" in want to the minted ids found at the same
// places in got, checking that equal placeholders are equal ids.
type placeholders map[string]string

func (ph placeholders) match(want, got any) bool {
	switch w := want.(type) {
	case string:
		g, ok := got.(string)
		if !ok {
			return false
		}
		if strings.HasPrefix(w, "<uuid") {
			if !uuidRE.MatchString(g) {
				return false
			}
			if prev, seen := ph[w]; seen {
				return prev == g
			}
			for _, v := range ph {
				if v == g {
					return false
				}
			}
			ph[w] = g
			return true
		}
		return w == g
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok || !ph.match(wv, gv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !ph.match(w[i], g[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(want, got)
}

func decodeAny(tb testing.TB, raw []byte) any {
	tb.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		tb.Fatalf("decode %s: %v", raw, err)
	}
	return v
}

// runVector returns the expanded events and the error of the first failing event with its index.
func runVector(v agVector) (events [][]byte, index int, err error) {
	if v.Section == "Schema" {
		for i, raw := range v.Events {
			e, err := DecodeEvent(raw)
			if err != nil {
				return events, i, err
			}
			events = append(events, e.JSON())
		}
		return events, -1, nil
	}
	p := NewPipeline(PipelineOptions{Upgrade: v.Upgrade, skipSchema: v.SkipSchema})
	for i, raw := range v.Events {
		out, err := p.Push(raw)
		for _, e := range out {
			events = append(events, e.JSON())
		}
		if err != nil {
			return events, i, err
		}
	}
	return events, -1, nil
}

func TestAGUIVectors(t *testing.T) {
	vectors := loadAGVectors(t)
	if len(vectors) < 160 {
		t.Fatalf("only %d vectors", len(vectors))
	}
	for _, v := range vectors {
		t.Run(v.Name, func(t *testing.T) {
			events, index, err := runVector(v)
			switch {
			case v.Accept != nil:
				if err != nil {
					t.Fatalf("event %d rejected: %v", index, err)
				}
				ph := placeholders{}
				if len(events) != len(v.Accept) {
					t.Fatalf("got %d events, want %d:\n%s", len(events), len(v.Accept), joinLines(events))
				}
				for i := range events {
					if !ph.match(decodeAny(t, v.Accept[i]), decodeAny(t, events[i])) {
						t.Fatalf("event %d = %s, want %s\nall:\n%s", i, events[i], v.Accept[i], joinLines(events))
					}
				}
			case v.Reject != "":
				var ve *ViolationError
				if !errors.As(err, &ve) {
					t.Fatalf("got err %v (%T), want violation %q", err, err, v.Reject)
				}
				if strings.Contains(v.Reject, "<uuid") {
					re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(v.Reject), "<uuid1>", "[0-9a-f-]{36}") + "$")
					if !re.MatchString(ve.Message) {
						t.Fatalf("violation %q, want %q", ve.Message, v.Reject)
					}
				} else if ve.Message != v.Reject {
					t.Fatalf("violation\n got %q\nwant %q", ve.Message, v.Reject)
				}
			case v.SchemaError != nil:
				var se *SchemaError
				if !errors.As(err, &se) {
					t.Fatalf("got err %v (%T), want schema error %+v", err, err, *v.SchemaError)
				}
				if index != v.SchemaError.Index || se.Path != v.SchemaError.Path || se.Message != v.SchemaError.Message {
					t.Fatalf("event %d: schema error %q %q, want event %d: %q %q", index, se.Path, se.Message, v.SchemaError.Index, v.SchemaError.Path, v.SchemaError.Message)
				}
			default:
				t.Fatal("vector has no outcome")
			}
		})
	}
}

func joinLines(events [][]byte) string {
	var b strings.Builder
	for _, e := range events {
		b.Write(e)
		b.WriteByte('\n')
	}
	return b.String()
}
