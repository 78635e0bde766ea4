package threadstore

import (
	"encoding/json"
	"strconv"

	"github.com/wsgateway/wsgateway/internal/jsonenc"
)

// A thread's value is written at every acceptance and finish of its runs. encoding/json
// spends most of that on reflection over the head (its runs, the sealed records' refs, the
// times), whose fields are strings, numbers and times only: appendJSON writes those itself,
// the same bytes as json.Marshal, and hands the transcript and the sealed leading messages,
// which hold JSON of the agents' and the clients' (metadata, raw parts), to json.Marshal,
// which checks and compacts it as before. TestThreadValueJSON holds it to json.Marshal's
// bytes for values with every field set.

// appendJSON appends v's encoding, as json.Marshal writes it.
func (v threadValue) appendJSON(b []byte) ([]byte, error) {
	t := &v.Thread
	b = append(b, `{"principal":`...)
	b = jsonenc.String(b, t.Principal)
	b = append(b, `,"threadId":`...)
	b = jsonenc.String(b, t.ThreadID)
	b = append(b, `,"title":`...)
	b = jsonenc.String(b, t.Title)
	b = append(b, `,"created":`...)
	b = jsonenc.Time(b, t.Created)
	b = append(b, `,"updated":`...)
	b = jsonenc.Time(b, t.Updated)
	b = append(b, `,"runs":`...)
	b = jsonenc.Slice(b, t.Runs, ThreadRun.appendJSON)
	if t.Dropped != 0 {
		b = append(b, `,"dropped":`...)
		b = strconv.AppendInt(b, int64(t.Dropped), 10)
	}
	tr, err := json.Marshal(t.Transcript)
	if err != nil {
		return nil, err
	}
	b = append(append(b, `,"transcript":`...), tr...)
	if t.Sealed != nil {
		b = append(b, `,"sealed":`...)
		if b, err = t.Sealed.appendJSON(b); err != nil {
			return nil, err
		}
	}
	if len(t.Forks) > 0 {
		b = append(b, `,"forks":`...)
		b = jsonenc.Slice(b, t.Forks, Fork.appendJSON)
	}
	if v.Parts != nil {
		b = append(b, `,"parts":{"id":`...)
		b = jsonenc.String(b, v.Parts.ID)
		b = append(b, `,"n":`...)
		b = strconv.AppendInt(b, int64(v.Parts.N), 10)
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func (r ThreadRun) appendJSON(b []byte) []byte {
	b = append(b, `{"runId":`...)
	b = jsonenc.String(b, r.RunID)
	b = append(b, `,"state":`...)
	b = jsonenc.String(b, r.State)
	if r.Code != "" {
		b = append(b, `,"code":`...)
		b = jsonenc.String(b, r.Code)
	}
	b = append(b, `,"started":`...)
	b = jsonenc.Time(b, r.Started)
	if !r.Ended.IsZero() {
		b = append(b, `,"ended":`...)
		b = jsonenc.Time(b, r.Ended)
	}
	if len(r.Added) > 0 {
		b = append(b, `,"added":`...)
		b = jsonenc.Slice(b, r.Added, appendStringElem)
	}
	if len(r.Rollback) > 0 {
		b = append(b, `,"rollback":`...)
		b = jsonenc.Slice(b, r.Rollback, appendStringElem)
	}
	if r.Forked {
		b = append(b, `,"forked":true`...)
	}
	return append(b, '}')
}

func (s *Sealed) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(s.Count), 10)
	if len(s.Recent) > 0 {
		b = append(b, `,"recent":`...)
		b = jsonenc.Slice(b, s.Recent, RecordRef.appendJSON)
	}
	if s.Last != nil {
		b = append(b, `,"last":`...)
		b = s.Last.appendJSON(b)
	}
	b = append(b, `,"newest":`...)
	b = jsonenc.Slice(b, s.Newest, SealedID.appendJSON)
	if len(s.Lead) > 0 {
		lead, err := json.Marshal(s.Lead)
		if err != nil {
			return nil, err
		}
		b = append(append(b, `,"lead":`...), lead...)
	}
	b = append(b, `,"oldest":`...)
	b = jsonenc.Time(b, s.Oldest)
	return append(b, '}'), nil
}

func (r RecordRef) appendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.String(b, r.ID)
	for _, f := range [...]struct {
		key string
		n   int
	}{{`,"n":`, r.N}, {`,"from":`, r.From}, {`,"count":`, r.Count}, {`,"bytes":`, r.Bytes}} {
		b = strconv.AppendInt(append(b, f.key...), int64(f.n), 10)
	}
	return append(b, '}')
}

func (id SealedID) appendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.String(b, id.ID)
	b = append(b, `,"role":`...)
	b = jsonenc.String(b, id.Role)
	return append(b, '}')
}

func (f Fork) appendJSON(b []byte) []byte {
	b = append(b, `{"after":`...)
	b = jsonenc.String(b, f.After)
	b = append(b, `,"children":`...)
	b = jsonenc.Slice(b, f.Children, Child.appendJSON)
	return append(b, '}')
}

func (c Child) appendJSON(b []byte) []byte {
	b = append(b, `{"first":`...)
	b = jsonenc.String(b, c.First)
	if c.Ref != nil {
		b = append(b, `,"ref":`...)
		b = c.Ref.appendJSON(b)
	}
	return append(b, '}')
}

// appendStringElem is jsonenc.String for jsonenc.Slice.
func appendStringElem(s string, b []byte) []byte { return jsonenc.String(b, s) }
