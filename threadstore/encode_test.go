package threadstore

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/jsonenc/jsonenctest"
	"github.com/wsgateway/wsgateway/thread"
)

// TestThreadValueJSON holds appendJSON to json.Marshal's bytes, for thread values with every
// exported field set at random (a field added to a thread's types and not to appendJSON
// fails it), and for the zero value.
func TestThreadValueJSON(t *testing.T) {
	jsonenctest.Check(t, func(v threadValue) ([]byte, error) { return v.appendJSON(nil) })
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
