package jetstream

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/thread"
)

// A thread is a log (docs/THREADS.md, "How a thread is stored"): its value under the thread's
// key is its head (title, times, its newest runs) with the transcript's newest messages only,
// the hot tail that turns change; the older messages are sealed into records, each written
// once under the thread's key (<thread key>.r.<ID>.<i>, split into parts like a large value)
// and never changed, each naming the record before it. A turn reads and writes the head and
// the hot tail, and, now and then, seals what has settled into one more record: its cost does
// not grow with the thread. An index key per sealed message (<thread key>.i.<hash of its id>)
// holds its position, so that a run posting messages the hot tail no longer holds finds them
// known. Paging walks the records from the newest; the agent's context reads as many of the
// newest records as its byte budget takes (records never change, so a store keeps the ones it
// read, decoded, for the next turns).
//
// A thread written before records existed is a head whose hot tail is the whole transcript:
// it reads as it did, and its first update seals what has settled.

// Seal bounds: the hot tail keeps at least hotKeep messages; what settled before them is
// sealed once it is sealMin messages or sealBytes of JSON.
const (
	hotKeep   = 16
	sealMin   = 16
	sealBytes = 128 << 10
	// keepRuns is how many ended runs the head keeps; older ones go with the sealed messages.
	keepRuns = 32
)

// Sealed names a thread's sealed messages: positions 0 to Count-1 of its transcript, the
// hot tail following them.
type Sealed struct {
	Last  RecordRef `json:"last"`  // the newest record
	Count int       `json:"count"` // messages sealed
	// Lead are the transcript's leading system messages, also sealed: a run's agent is given
	// them however long the thread (docs/THREADS.md section 5).
	Lead []thread.Message `json:"lead,omitempty"`
	// Oldest is when the oldest record of the chain was written: the records expire with the
	// bucket's TTL, so a thread still in use writes its chain again (refresh) before then.
	Oldest time.Time `json:"oldest"`
}

// RecordRef names one record: its parts' ID and how many there are.
type RecordRef struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

// threadRecord is one record of sealed messages.
type threadRecord struct {
	Prev     *RecordRef       `json:"prev,omitempty"`
	From     int              `json:"from"` // the position of its first message
	Messages []thread.Message `json:"messages"`
	// Runs are ended runs the head let go of when the record was sealed.
	Runs []ThreadRun `json:"runs,omitempty"`
}

// recordKey returns the thread key of a record's parts (threadParts.key adds ID and i).
func recordKey(key string) string { return key + ".r" }

// indexKey returns the key of the position of the thread key's message id.
func indexKey(key, id string) string {
	h := sha256.Sum256([]byte("message\x00" + id))
	return key + ".i." + keyEncoding.EncodeToString(h[:])
}

// seal moves what settled in t's hot tail into a new record, and refreshes the record chain
// when its oldest record nears the bucket's TTL. It changes t only when the writes it made
// succeeded; a record of a value that then loses its compare-and-set is left to the TTL.
func (s *Store) seal(ctx context.Context, key string, t *Thread) error {
	if t.Sealed != nil && time.Since(t.Sealed.Oldest) > s.cfg.ThreadRetention/2 {
		if err := s.refresh(ctx, key, t); err != nil {
			return err
		}
	}
	tr := &t.Transcript
	if tr.Interrupts != nil || len(tr.Late) > 0 || len(tr.Answered) > 0 {
		return nil // answers may change settled messages
	}
	cut := len(tr.Messages) - hotKeep
	for _, a := range tr.Anchors { // a run's reply goes after its anchor: keep the anchor hot
		at := -1
		if a.After != "" {
			at = slicesIndex(tr.Messages, a.After)
		}
		cut = min(cut, at)
	}
	if cut <= 0 {
		return nil
	}
	size := 0
	for _, m := range tr.Messages[:cut] {
		size += len(m.Parts) * 64
		for _, p := range m.Parts {
			size += len(p.Content) + len(p.Arguments) + len(p.Output) + len(p.Input)
		}
	}
	if cut < sealMin && size < sealBytes {
		return nil
	}
	from := 0
	var prev *RecordRef
	if t.Sealed != nil {
		from, prev = t.Sealed.Count, &t.Sealed.Last
	}
	rec := threadRecord{Prev: prev, From: from, Messages: tr.Messages[:cut]}
	var keptRuns []ThreadRun
	if n := len(t.Runs); n > keepRuns {
		for i, r := range t.Runs {
			if i < n-keepRuns && r.State != ThreadRunRunning {
				rec.Runs = append(rec.Runs, r)
			} else {
				keptRuns = append(keptRuns, r)
			}
		}
	}
	ref, err := s.writeRecord(ctx, key, &rec)
	if err != nil {
		return err
	}
	if err := s.writeIndex(ctx, key, rec.Messages, from); err != nil {
		return err
	}
	next := &Sealed{Last: ref, Count: from + cut, Oldest: time.Now().UTC()}
	if t.Sealed != nil {
		next.Lead, next.Oldest = t.Sealed.Lead, t.Sealed.Oldest
	} else {
		for _, m := range rec.Messages {
			if m.Role != "system" {
				break
			}
			next.Lead = append(next.Lead, m)
		}
	}
	t.Sealed = next
	tr.Messages = tr.Messages[cut:]
	if rec.Runs != nil {
		t.Runs = keptRuns
	}
	return nil
}

func slicesIndex(msgs []thread.Message, id string) int {
	for i := range msgs {
		if msgs[i].ID == id {
			return i
		}
	}
	return -1
}

// writeRecord writes rec under a new ID, in parts if it does not fit in one NATS message.
func (s *Store) writeRecord(ctx context.Context, key string, rec *threadRecord) (RecordRef, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return RecordRef{}, err
	}
	p, err := s.writeParts(ctx, recordKey(key), b, int(s.nc.MaxPayload())-4096)
	if err != nil {
		return RecordRef{}, err
	}
	s.records.add(p.ID, rec, len(b))
	return RecordRef{ID: p.ID, N: p.N}, nil
}

// writeIndex writes the positions of msgs, the first at position from.
func (s *Store) writeIndex(ctx context.Context, key string, msgs []thread.Message, from int) error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i, m := range msgs {
		if m.ID == "" {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, errs[i] = s.threads.Put(ctx, indexKey(key, m.ID), []byte(strconv.Itoa(from+i)))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("thread: index: %w", err)
	}
	return nil
}

// readRecord returns the record ref names, from the store's cache of records if it has it.
func (s *Store) readRecord(ctx context.Context, key string, ref RecordRef) (*threadRecord, error) {
	if rec := s.records.get(ref.ID); rec != nil {
		return rec, nil
	}
	p := &threadParts{ID: ref.ID, N: ref.N}
	b, err := s.readParts(ctx, recordKey(key), p)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("thread: record %s is gone", ref.ID)
	}
	var rec threadRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("thread: record %s: %w", ref.ID, err)
	}
	s.records.add(ref.ID, &rec, len(b))
	return &rec, nil
}

// eachRecord calls f with t's records from the newest, until f returns false or the chain
// ends.
func (s *Store) eachRecord(ctx context.Context, key string, from *RecordRef, f func(ref RecordRef, rec *threadRecord) bool) error {
	for ref := from; ref != nil; {
		rec, err := s.readRecord(ctx, key, *ref)
		if err != nil {
			return err
		}
		if !f(*ref, rec) {
			return nil
		}
		ref = rec.Prev
	}
	return nil
}

// refresh writes t's record chain again, each record as it was under a new ID, and its
// index, so that a thread in use keeps its oldest messages past the bucket's TTL. It costs
// the whole thread, once per half a retention.
func (s *Store) refresh(ctx context.Context, key string, t *Thread) error {
	var recs []*threadRecord
	if err := s.eachRecord(ctx, key, &t.Sealed.Last, func(_ RecordRef, rec *threadRecord) bool {
		recs = append(recs, rec)
		return true
	}); err != nil {
		return err
	}
	var prev *RecordRef
	for i := len(recs) - 1; i >= 0; i-- {
		rec := *recs[i]
		rec.Prev = prev
		ref, err := s.writeRecord(ctx, key, &rec)
		if err != nil {
			return err
		}
		if err := s.writeIndex(ctx, key, rec.Messages, rec.From); err != nil {
			return err
		}
		prev = &ref
	}
	next := *t.Sealed
	next.Last, next.Oldest = *prev, time.Now().UTC()
	t.Sealed = &next
	return nil
}

// sealedAt returns the position of a sealed message of the thread key, -1 if the thread has
// none of that id (count: how many messages it has sealed).
func (s *Store) sealedAt(ctx context.Context, key, id string, count int) (int, error) {
	if id == "" {
		return -1, nil
	}
	e, err := s.threads.Get(ctx, indexKey(key, id))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("thread: index: %w", err)
	}
	pos, err := strconv.Atoi(string(e.Value()))
	if err != nil || pos >= count {
		return -1, nil // written by a seal that lost its compare-and-set, or unsealed since
	}
	return pos, nil
}

// unseal moves the sealed messages from position pos on back into t's hot tail (and the runs
// their records hold back into its head), so that an update can change them: a run frame
// whose list ends at a sealed message (a regenerate) cuts what follows it.
func (s *Store) unseal(ctx context.Context, key string, t *Thread, pos int) error {
	var back []*threadRecord
	var at *threadRecord
	if err := s.eachRecord(ctx, key, &t.Sealed.Last, func(_ RecordRef, rec *threadRecord) bool {
		back = append(back, rec)
		at = rec
		return rec.From > pos
	}); err != nil {
		return err
	}
	var msgs []thread.Message
	var runs []ThreadRun
	for i := len(back) - 1; i >= 0; i-- {
		msgs = append(msgs, back[i].Messages...)
		runs = append(runs, back[i].Runs...)
	}
	// The records are shared (recordCache) and never change: the hot tail gets copies.
	msgs = thread.Transcript{Messages: msgs}.Clone().Messages
	t.Transcript.Messages = append(msgs, t.Transcript.Messages...)
	t.Runs = append(runs, t.Runs...)
	if at.Prev == nil {
		t.Sealed = nil
		return nil
	}
	next := *t.Sealed
	next.Last, next.Count = *at.Prev, at.From
	if len(next.Lead) > next.Count {
		next.Lead = next.Lead[:next.Count]
	}
	t.Sealed = &next
	return nil
}

// knownInput returns a run's input (RunAgentInput JSON) without the messages of t that its
// hot tail no longer holds, so that Transcript.Accept, which knows the hot tail only, merges
// it as it would the whole transcript. The messages a client posts that the thread knows
// come before those it does not (the whole transcript, its newest messages, a stale copy of
// it, each followed by new ones): everything before the first message the hot tail holds is
// sealed. When the hot tail holds none, the last posted message the index knows ends the
// known ones; if it is the last message of the list, the list is a regenerate from a sealed
// message, which is unsealed for Accept to cut what follows it.
func (s *Store) knownInput(ctx context.Context, key string, t *Thread, input json.RawMessage) (json.RawMessage, error) {
	if t.Sealed == nil {
		return input, nil
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, fmt.Errorf("thread: accept: %w", err)
	}
	var msgs []struct {
		ID   string `json:"id"`
		Role string `json:"role"`
	}
	if raw, ok := in["messages"]; !ok || json.Unmarshal(raw, &msgs) != nil || len(msgs) == 0 {
		return input, nil
	}
	hot := make(map[string]bool, len(t.Transcript.Messages))
	for _, m := range t.Transcript.Messages {
		hot[m.ID] = true
	}
	drop := -1 // msgs[:drop+1] are sealed
	for i, m := range msgs {
		if hot[m.ID] {
			drop = i - 1
			break
		}
	}
	if drop < 0 && !hot[msgs[0].ID] {
		last := -1 // the last user, system or assistant message
		for i := len(msgs) - 1; i >= 0; i-- {
			if r := msgs[i].Role; r == "user" || r == "system" || r == "assistant" {
				last = i
				break
			}
		}
		for i := len(msgs) - 1; i >= 0; i-- {
			pos, err := s.sealedAt(ctx, key, msgs[i].ID, t.Sealed.Count)
			if err != nil {
				return nil, err
			}
			if pos < 0 {
				continue
			}
			if i == last {
				// A regenerate from a sealed message: Accept cuts what follows it.
				if err := s.unseal(ctx, key, t, pos); err != nil {
					return nil, err
				}
				drop = -1
				for j := range msgs {
					if hot[msgs[j].ID] || slicesIndex(t.Transcript.Messages, msgs[j].ID) >= 0 {
						break
					}
					drop = j
				}
			} else {
				drop = i
			}
			break
		}
	}
	if drop < 0 {
		return input, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(in["messages"], &raw); err != nil {
		return nil, fmt.Errorf("thread: accept: %w", err)
	}
	b, err := json.Marshal(raw[drop+1:])
	if err != nil {
		return nil, err
	}
	in["messages"] = b
	return json.Marshal(in)
}

// SealedMessages returns the newest of t's sealed messages, oldest first, at least budget
// bytes of their JSON if it has as many (all of them for budget <= 0), after its leading
// system messages (Sealed.Lead) when the newest do not reach back to them. It returns nil
// for a thread with none sealed.
func (s *Store) SealedMessages(ctx context.Context, t *Thread, budget int) ([]thread.Message, error) {
	if t == nil || t.Sealed == nil {
		return nil, nil
	}
	key := threadKey(t.Principal, t.ThreadID)
	var recs []*threadRecord
	size := 0
	if err := s.eachRecord(ctx, key, &t.Sealed.Last, func(_ RecordRef, rec *threadRecord) bool {
		recs = append(recs, rec)
		for _, m := range rec.Messages {
			size += messageSize(m)
		}
		return budget <= 0 || size < budget
	}); err != nil {
		return nil, err
	}
	var out []thread.Message
	if from := recs[len(recs)-1].From; from > 0 {
		out = append(out, t.Sealed.Lead[:min(len(t.Sealed.Lead), from)]...)
	}
	for i := len(recs) - 1; i >= 0; i-- {
		out = append(out, recs[i].Messages...)
	}
	return out, nil
}

// messageSize estimates the bytes of m's JSON.
func messageSize(m thread.Message) int {
	n := 64 + len(m.ID)
	for _, p := range m.Parts {
		n += 64 + len(p.Content) + len(p.Arguments) + len(p.Output) + len(p.Input)
	}
	return n
}

// sealedCursor is a page cursor inside a record: the messages before Messages[I] of the
// record Ref, all of them for I = -1. On the wire it is cursorPrefix and its JSON in
// base64url; any other cursor is a message id.
type sealedCursor struct {
	Ref RecordRef `json:"r"`
	I   int       `json:"i"`
}

const cursorPrefix = "sealed."

func (c sealedCursor) String() string {
	b, _ := json.Marshal(c)
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func parseSealedCursor(s string) (sealedCursor, bool) {
	rest, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok {
		return sealedCursor{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	var c sealedCursor
	if err != nil || json.Unmarshal(b, &c) != nil || c.Ref.ID == "" || c.Ref.N <= 0 || c.I < -1 {
		return sealedCursor{}, false
	}
	return c, true
}

// ThreadPage cuts a page of t's messages, newest window first, as thread.Page cuts a
// transcript, reading the records it reaches: hot is t's hot tail as the hydrate shows it
// (with an active run's message). limit <= 0 answers every message (every record read) and
// cursor "". before is "" for the newest window, or a cursor ThreadPage issued: the window
// then holds the newest limit messages strictly older than it. A cursor naming no message of
// the thread answers an empty window and "".
func (s *Store) ThreadPage(ctx context.Context, t *Thread, hot []thread.Message, limit int, before string) (window []thread.Message, cursor string, err error) {
	if t.Sealed == nil {
		w, c := thread.Page(hot, limit, before)
		return w, c, nil
	}
	if limit <= 0 {
		older, err := s.SealedMessages(ctx, t, 0)
		if err != nil {
			return nil, "", err
		}
		return append(older, hot...), "", nil
	}
	limit = min(limit, thread.MaxPage)
	key := threadKey(t.Principal, t.ThreadID)
	// Where the window ends: in the hot tail (end), or in a record (from, at).
	end := len(hot)
	from, at := &t.Sealed.Last, -1
	if before != "" {
		end = slicesIndex(hot, before)
		if end < 0 {
			if c, ok := parseSealedCursor(before); ok {
				from, at = &c.Ref, c.I
			} else if from, at, err = s.locate(ctx, key, t, before); err != nil || from == nil {
				return []thread.Message{}, "", err
			}
			end = 0
			hot = nil
		}
	}
	start := max(end-limit, 0)
	window = hot[start:end:end]
	if start > 0 {
		return window, hot[start].ID, nil
	}
	var older []thread.Message
	err = s.eachRecord(ctx, key, from, func(ref RecordRef, rec *threadRecord) bool {
		msgs := rec.Messages
		if at >= 0 {
			msgs = msgs[:min(at, len(msgs))]
			at = -1
		}
		need := limit - len(window) - len(older)
		if need < len(msgs) {
			j := len(msgs) - need
			older = slices.Concat(msgs[j:], older)
			cursor = sealedCursor{Ref: ref, I: j}.String()
			return false
		}
		older = slices.Concat(msgs, older)
		if len(window)+len(older) == limit && rec.Prev != nil {
			cursor = sealedCursor{Ref: *rec.Prev, I: -1}.String()
			return false
		}
		return true
	})
	if err != nil {
		return nil, "", err
	}
	return append(older, window...), cursor, nil
}

// locate finds the record that holds the sealed message id (a cursor a page issued while the
// message was in the hot tail): the record and the message's index in it; nil when the
// thread has no such message.
func (s *Store) locate(ctx context.Context, key string, t *Thread, id string) (*RecordRef, int, error) {
	pos, err := s.sealedAt(ctx, key, id, t.Sealed.Count)
	if err != nil || pos < 0 {
		return nil, 0, err
	}
	var found *RecordRef
	at := 0
	err = s.eachRecord(ctx, key, &t.Sealed.Last, func(ref RecordRef, rec *threadRecord) bool {
		if rec.From > pos {
			return true
		}
		if i := pos - rec.From; i < len(rec.Messages) && rec.Messages[i].ID == id {
			found, at = &ref, i
		}
		return false
	})
	return found, at, err
}

// recordCache keeps decoded records, which never change, by ID: the newest records of a
// thread are read by each of its turns' agents and by each hydrate. It holds at most
// recordCacheBytes (by their JSON's size), the least recently used going first.
type recordCache struct {
	mu    sync.Mutex
	by    map[string]*list.Element
	order list.List // of *cachedRecord, most recently used first
	size  int
}

type cachedRecord struct {
	id   string
	rec  *threadRecord
	size int
}

const recordCacheBytes = 32 << 20

func (c *recordCache) add(id string, rec *threadRecord, size int) {
	if size > recordCacheBytes/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]*list.Element{}
	}
	if e, ok := c.by[id]; ok {
		c.order.MoveToFront(e)
		return
	}
	c.by[id] = c.order.PushFront(&cachedRecord{id, rec, size})
	c.size += size
	for c.size > recordCacheBytes {
		e := c.order.Back()
		cr := e.Value.(*cachedRecord)
		c.order.Remove(e)
		delete(c.by, cr.id)
		c.size -= cr.size
	}
}

func (c *recordCache) get(id string) *threadRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.by[id]
	if !ok {
		return nil
	}
	c.order.MoveToFront(e)
	return e.Value.(*cachedRecord).rec
}
