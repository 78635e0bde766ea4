package threadstore

import (
	"container/list"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
)

// A thread is a log (docs/THREADS.md, "How a thread is stored"). Its value under the thread's
// key is its head: title, times, its running and newest runs, and the messages that may still
// change (the hot tail: a running run's, a paused run's, a call's that waits for its client
// tool). Every other message is sealed: once a run's finish settles its messages, they are
// written once into a record of their own (<thread key>.r.<ID>.<i>, in parts when larger than
// a NATS message, like a large value) and leave the head. The head names its newest records
// (Sealed.Recent); every segmentSize of them go into a segment (<thread key>.r.<ID>.<i> too),
// which names the segment before it. The head also names its newest sealed messages
// (Sealed.Newest), so that a run posting the whole transcript finds them known without a
// read; a stale copy is found in the records (findSealed). A turn thus writes its own
// messages once and the small head twice, whatever the thread's length. Paging reads the records of its window, in parallel, from the newest;
// the agent's context reads as many of the newest as its byte budget takes. Records never
// change: a store keeps those it read or wrote, decoded (recordCache).
//
// A thread written before records existed is a head whose hot tail is the whole transcript:
// it reads as it did, and its next update seals what has settled.

const (
	// segmentSize is how many records a segment names.
	segmentSize = 16
	// keepRuns is how many ended runs the head keeps; older ones go with the sealed messages.
	keepRuns = 4
	// readers bounds the records one read fetches at once.
	readers = 16
)

// Sealed names a thread's sealed messages: positions 0 to Count-1 of its transcript, the
// hot tail following them.
type Sealed struct {
	Count  int         `json:"count"`            // messages sealed
	Recent []RecordRef `json:"recent,omitempty"` // the newest records, oldest first
	Last   *RecordRef  `json:"last,omitempty"`   // the newest segment: the records before Recent
	// Newest are the ids and roles of the newest sealed messages: a run posting them finds
	// them known without a read, and a hydrate's placeholder rule reads the role of the
	// message before the hot tail.
	Newest []SealedID `json:"newest"`
	// Lead are the transcript's leading system messages, also sealed: a run's agent is given
	// them however long the thread (docs/THREADS.md section 5).
	Lead []thread.Message `json:"lead,omitempty"`
	// Oldest is when the oldest record or segment was written: they expire with the bucket's
	// TTL, so a thread still in use writes them again (refresh) before then.
	Oldest time.Time `json:"oldest"`
}

// RecordRef names one record (or segment): its parts' ID and count, the position of its
// first message, its messages and their size in bytes of JSON.
type RecordRef struct {
	ID    string `json:"id"`
	N     int    `json:"n"`
	From  int    `json:"from"`
	Count int    `json:"count"`
	Bytes int    `json:"bytes"`
}

// end returns the position after ref's last message.
func (r RecordRef) end() int { return r.From + r.Count }

// threadRecord is one record: sealed messages, and the ended runs the head let go of then.
type threadRecord struct {
	Messages []thread.Message `json:"messages"`
	Runs     []ThreadRun      `json:"runs,omitempty"`

	// agent is what the agents of later turns are given of Messages (thread.AgentMessages),
	// converted once, by its first reader: a record never changes, and every turn of a long
	// thread gives its agent the same sealed messages again.
	agent atomic.Pointer[[]protocol.Message]
}

// agentMessages returns rec's messages as an agent is given them, and the bytes of JSON this
// call converted (0 when an earlier call did): the record's size in the cache grows by them.
func (rec *threadRecord) agentMessages() ([]protocol.Message, int) {
	if p := rec.agent.Load(); p != nil {
		return *p, 0
	}
	msgs := thread.AgentMessages(rec.Messages)
	if !rec.agent.CompareAndSwap(nil, &msgs) {
		return *rec.agent.Load(), 0
	}
	n := 0
	for _, m := range msgs {
		n += len(m.Raw)
	}
	return msgs, n
}

// threadSegment is one segment: segmentSize records, oldest first, and the segment before.
type threadSegment struct {
	Prev    *RecordRef  `json:"prev,omitempty"`
	Records []RecordRef `json:"records"`
}

// recordKey returns the thread key of records' and segments' parts (threadParts.key adds
// ID and i).
func recordKey(key string) string { return key + ".r" }

// sealable returns how many of t's first messages have settled: every message, but for
// those a later update may change: from a running run's anchor on (its reply goes right
// after it) and from the first message its acceptance added (a rollback takes them out),
// every one while interrupts are pending or answers wait (an approval changes the call that
// asked), and from a call that waits for its client tool's result on.
func sealable(t *Thread) int {
	tr := &t.Transcript
	if tr.Interrupts != nil || len(tr.Late) > 0 || len(tr.Answered) > 0 {
		return 0
	}
	cut := len(tr.Messages)
	index := func(id string) int {
		return slices.IndexFunc(tr.Messages, func(m thread.Message) bool { return m.ID == id })
	}
	for _, a := range tr.Anchors {
		if a.After != "" { // "": the reply goes first, before every hot message
			cut = min(cut, max(index(a.After), 0))
		}
	}
	for _, r := range t.Runs {
		if len(r.Added) > 0 {
			if at := index(r.Added[0]); at >= 0 {
				cut = min(cut, at)
			}
		}
	}
	for i, m := range tr.Messages[:cut] {
		for _, p := range m.Parts {
			if p.Type == "tool-call" && p.Output == nil && p.Approval == nil && p.State != "complete" && p.State != "error" {
				return i
			}
		}
	}
	return cut
}

// sealPlan is a seal whose record is written: applied to the thread's value by
// compare-and-set if the value still starts as it did when the record was written.
type sealPlan struct {
	base  *Sealed  // the Sealed it extends (nil: none)
	ids   []string // the ids of the messages it seals, the first of the hot tail
	moved []string // the runs its record holds, which leave the head
	next  *Sealed  // the Sealed once applied
	// forks, when the plan wrote the stashed branches again (refresh), are t's forks naming
	// them, applied if t's forks are still baseForks.
	forks, baseForks []Fork
}

// sealLater seals, in the background, what the finish of a run left settled in t (a copy of
// the value it wrote, with only the settled messages in its hot tail) when the finish could
// not (sealNow): it writes their record (and refreshes the older ones when the oldest nears
// the bucket's TTL), with no update of the thread held, then removes them from the head in an
// update of its own. A seal that fails, or finds the thread changed, leaves the messages hot:
// a later finish seals them; what it wrote is left to the TTL.
func (s *Store) sealLater(principal, threadID string, t *Thread) {
	refresh := t.Sealed != nil && time.Since(t.Sealed.Oldest) > s.cfg.Retention/2
	if len(t.Transcript.Messages) == 0 && !refresh {
		return
	}
	s.sealing.Add(1)
	sealing := s.background("sealing a thread's settled messages", "", func(ctx context.Context) error {
		defer s.sealing.Add(-1)
		key := threadKey(principal, threadID)
		plan, err := s.planSeal(ctx, key, t, refresh)
		if err != nil || plan == nil {
			return err
		}
		// The seal holds the thread's updates (the next turn's start) while it writes: a
		// short bound, so that NATS in trouble (an election) holds them up no longer than
		// that; a seal given up on leaves the messages to a later finish.
		uctx, cancel := context.WithTimeout(ctx, sealUpdateTimeout)
		defer cancel()
		return s.updateThread(uctx, principal, threadID, nil, func(t *Thread, exists bool) (bool, error) {
			return exists && plan.apply(t), nil
		})
	})
	if !sealing {
		s.sealing.Add(-1)
	}
}

// sealUpdateTimeout bounds the update that applies a seal.
const sealUpdateTimeout = 2 * time.Second

// planSeal writes the record of t's hot tail (all of it settled) under the next position,
// and the segment that record completes, after refreshing the records when refresh is set.
func (s *Store) planSeal(ctx context.Context, key string, t *Thread, refresh bool) (*sealPlan, error) {
	plan := &sealPlan{base: t.Sealed}
	next := Sealed{Oldest: time.Now().UTC()}
	if t.Sealed != nil {
		next = *t.Sealed
	}
	if refresh {
		if err := s.refresh(ctx, key, &next); err != nil {
			return nil, err
		}
	}
	// The stashed branches are written again with the records, and when a first seal (of a
	// thread unsealed whole by an edit of its start) sets Oldest anew.
	if refresh || t.Sealed == nil && len(t.Forks) > 0 {
		forks, err := s.refreshForks(ctx, key, t.Forks)
		if err != nil {
			return nil, err
		}
		plan.forks, plan.baseForks = forks, t.Forks
	}
	msgs := t.Transcript.Messages
	if len(msgs) == 0 {
		plan.next = &next
		return plan, nil
	}
	rec := threadRecord{Messages: msgs}
	ended := 0
	for _, r := range slices.Backward(t.Runs) {
		if !active(r.State) {
			ended++
		}
		if !active(r.State) && ended > keepRuns {
			rec.Runs = append(rec.Runs, r)
			plan.moved = append(plan.moved, r.RunID)
		}
	}
	slices.Reverse(rec.Runs)
	ref, err := s.writeRecord(ctx, key, &rec, next.Count)
	if err != nil {
		return nil, err
	}
	if next.Count == 0 {
		for _, m := range msgs {
			if m.Role != "system" {
				break
			}
			next.Lead = append(next.Lead, m)
		}
	}
	next.Recent = append(slices.Clip(next.Recent), ref)
	if len(next.Recent) >= segmentSize {
		seg := threadSegment{Prev: next.Last, Records: next.Recent}
		sref, err := s.writeSegment(ctx, key, &seg)
		if err != nil {
			return nil, err
		}
		next.Last, next.Recent = &sref, nil
	}
	next.Count += len(msgs)
	next.Newest = newest(msgs)
	for _, m := range msgs {
		plan.ids = append(plan.ids, m.ID)
	}
	plan.next = &next
	return plan, nil
}

// apply seals in t what the plan's record holds, if t's sealed messages are still the plan's
// base and its hot tail still starts with the plan's messages, settled; it reports whether it
// changed t.
func (p *sealPlan) apply(t *Thread) bool {
	if !sameSealed(t.Sealed, p.base) || sealable(t) < len(p.ids) || p.forks != nil && !sameForks(t.Forks, p.baseForks) {
		return false
	}
	for i, id := range p.ids {
		if t.Transcript.Messages[i].ID != id {
			return false
		}
	}
	t.Transcript.Messages = t.Transcript.Messages[len(p.ids):]
	t.Sealed = p.next
	if p.forks != nil {
		t.Forks = p.forks
	}
	t.Runs = slices.DeleteFunc(t.Runs, func(r ThreadRun) bool { return slices.Contains(p.moved, r.RunID) })
	return true
}

// sameSealed reports whether a and b name the same sealed messages.
func sameSealed(a, b *Sealed) bool {
	if a == nil || b == nil {
		return a == b
	}
	newestRef := func(s *Sealed) string {
		if n := len(s.Recent); n > 0 {
			return s.Recent[n-1].ID
		}
		if s.Last != nil {
			return s.Last.ID
		}
		return ""
	}
	return a.Count == b.Count && newestRef(a) == newestRef(b) && a.Oldest.Equal(b.Oldest)
}

// SealedID is a sealed message's id and role.
type SealedID struct {
	ID   string `json:"id"`
	Role string `json:"role"`
}

// newestSealed is how many of the newest sealed messages the head names (Sealed.Newest).
const newestSealed = 4

// newest returns the ids and roles of the last newestSealed of msgs.
func newest(msgs []thread.Message) []SealedID {
	var ids []SealedID
	for _, m := range msgs[max(len(msgs)-newestSealed, 0):] {
		ids = append(ids, SealedID{m.ID, m.Role})
	}
	return ids
}

// newestAt returns the position of the sealed message id if the head names it among the
// newest (Sealed.Newest), -1 if not.
func (sl *Sealed) newestAt(id string) int {
	for i, n := range sl.Newest {
		if n.ID == id {
			return sl.Count - len(sl.Newest) + i
		}
	}
	return -1
}

// writeRecord writes rec, whose first message is at position from, under a new ID.
func (s *Store) writeRecord(ctx context.Context, key string, rec *threadRecord, from int) (RecordRef, error) {
	return s.writeRef(ctx, key, rec, from, len(rec.Messages))
}

// writeSegment writes seg under a new ID.
func (s *Store) writeSegment(ctx context.Context, key string, seg *threadSegment) (RecordRef, error) {
	first, last := seg.Records[0], seg.Records[len(seg.Records)-1]
	return s.writeRef(ctx, key, seg, first.From, last.end()-first.From)
}

// writeRef writes v (a *threadRecord or *threadSegment, which count messages from position
// from) under a new ID, keeps it in the store's cache, and returns its ref.
func (s *Store) writeRef(ctx context.Context, key string, v any, from, count int) (RecordRef, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return RecordRef{}, err
	}
	p, err := s.writeParts(ctx, recordKey(key), b, int(s.nc.MaxPayload())-4096)
	if err != nil {
		return RecordRef{}, err
	}
	s.records.add(p.ID, v, len(b))
	return RecordRef{ID: p.ID, N: p.N, From: from, Count: count, Bytes: len(b)}, nil
}

// readRef returns the record or segment ref names, decoded into a new *T, from the store's
// cache if it has it.
func readRef[T any](ctx context.Context, s *Store, key string, ref RecordRef) (*T, error) {
	if v, ok := s.records.get(ref.ID).(*T); ok {
		return v, nil
	}
	b, err := s.readParts(ctx, recordKey(key), &threadParts{ID: ref.ID, N: ref.N})
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("thread: record %s is gone", ref.ID)
	}
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("thread: record %s: %w", ref.ID, err)
	}
	s.records.add(ref.ID, v, len(b))
	return v, nil
}

// refs calls f with the refs of sealed's records from the newest, until f returns false or
// the oldest was given; from, if not nil, is a segment to start at (a page cursor's), whose
// end must be at or past the first position f wants.
func (s *Store) refs(ctx context.Context, key string, sealed *Sealed, from *RecordRef, f func(RecordRef) bool) error {
	seg := sealed.Last
	if from == nil {
		for _, r := range slices.Backward(sealed.Recent) {
			if !f(r) {
				return nil
			}
		}
	} else {
		seg = from
	}
	for seg != nil {
		sg, err := readRef[threadSegment](ctx, s, key, *seg)
		if err != nil {
			return err
		}
		for _, r := range slices.Backward(sg.Records) {
			if !f(r) {
				return nil
			}
		}
		seg = sg.Prev
	}
	return nil
}

// readRecords returns the records refs name, in their order: those the cache holds at once,
// the others read readers at once.
func (s *Store) readRecords(ctx context.Context, key string, refs []RecordRef) ([]*threadRecord, error) {
	recs := make([]*threadRecord, len(refs))
	errs := make([]error, len(refs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, readers)
	s.records.getRecords(refs, recs)
	for i, r := range refs {
		if recs[i] != nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			recs[i], errs[i] = readRef[threadRecord](ctx, s, key, r)
		})
	}
	wg.Wait()
	return recs, errors.Join(errs...)
}

// sealedRange returns t's sealed messages at positions [from, to).
func (s *Store) sealedRange(ctx context.Context, key string, sealed *Sealed, seg *RecordRef, from, to int) ([]thread.Message, error) {
	if from >= to {
		return nil, nil
	}
	var refs []RecordRef
	if err := s.refs(ctx, key, sealed, seg, func(r RecordRef) bool {
		if r.From < to && r.end() > from {
			refs = append(refs, r)
		}
		return r.From > from
	}); err != nil {
		return nil, err
	}
	slices.Reverse(refs)
	recs, err := s.readRecords(ctx, key, refs)
	if err != nil {
		return nil, err
	}
	var out []thread.Message
	for i, rec := range recs {
		r := refs[i]
		lo, hi := max(from-r.From, 0), min(to-r.From, len(rec.Messages))
		out = append(out, rec.Messages[lo:hi]...)
	}
	if len(out) != to-from {
		return nil, fmt.Errorf("thread: records hold %d of the messages %d to %d", len(out), from, to)
	}
	return out, nil
}

// refresh writes the records and segments of sl again under new IDs, and names them in sl, so that a
// thread in use keeps its oldest messages past the bucket's TTL. It costs the whole thread,
// once per half a retention.
func (s *Store) refresh(ctx context.Context, key string, sl *Sealed) error {
	var refs []RecordRef
	if err := s.refs(ctx, key, sl, nil, func(r RecordRef) bool { refs = append(refs, r); return true }); err != nil {
		return err
	}
	slices.Reverse(refs)
	next := *sl
	next.Recent, next.Last, next.Oldest = nil, nil, time.Now().UTC()
	for i := 0; i < len(refs); i += readers {
		batch := refs[i:min(i+readers, len(refs))]
		recs, err := s.readRecords(ctx, key, batch)
		if err != nil {
			return err
		}
		for j, rec := range recs {
			ref, err := s.writeRecord(ctx, key, rec, batch[j].From)
			if err != nil {
				return err
			}
			if next.Recent = append(next.Recent, ref); len(next.Recent) == segmentSize {
				sref, err := s.writeSegment(ctx, key, &threadSegment{Prev: next.Last, Records: next.Recent})
				if err != nil {
					return err
				}
				next.Last, next.Recent = &sref, nil
			}
		}
	}
	*sl = next
	return nil
}

// findSealed returns the position of the newest of t's sealed messages whose id is one of
// ids, and that id; -1 when none is. It reads the records from the newest, readers at once,
// until it finds one: the cost of a run that posts a stale copy of a long thread, or pages
// from a cursor issued before its message was sealed.
func (s *Store) findSealed(ctx context.Context, key string, sealed *Sealed, ids map[string]bool) (int, string, error) {
	for i, n := range slices.Backward(sealed.Newest) {
		if ids[n.ID] {
			return sealed.Count - len(sealed.Newest) + i, n.ID, nil
		}
	}
	var batch []RecordRef
	pos, found := -1, ""
	search := func() error {
		recs, err := s.readRecords(ctx, key, batch)
		if err != nil {
			return err
		}
		for i, rec := range recs {
			for j, m := range slices.Backward(rec.Messages) {
				if ids[m.ID] {
					pos, found = batch[i].From+j, m.ID
					return nil
				}
			}
		}
		batch = batch[:0]
		return nil
	}
	var err error
	if rerr := s.refs(ctx, key, sealed, nil, func(r RecordRef) bool {
		if batch = append(batch, r); len(batch) == readers {
			err = search()
		}
		return err == nil && pos < 0
	}); rerr != nil {
		return -1, "", rerr
	}
	if err == nil && pos < 0 && len(batch) > 0 {
		err = search()
	}
	return pos, found, err
}

// unseal moves the sealed messages from the record that holds position pos on back into t's
// hot tail (and the runs those records hold back into its head), so that an update can
// change them: a run whose list ends at a sealed message (a regenerate) cuts what follows.
func (s *Store) unseal(ctx context.Context, key string, t *Thread, pos int) error {
	sealed := *t.Sealed
	var refs []RecordRef
	if err := s.refs(ctx, key, &sealed, nil, func(r RecordRef) bool {
		refs = append(refs, r)
		return r.From > pos
	}); err != nil {
		return err
	}
	slices.Reverse(refs)
	recs, err := s.readRecords(ctx, key, refs)
	if err != nil {
		return err
	}
	var msgs []thread.Message
	var runs []ThreadRun
	for _, rec := range recs {
		msgs = append(msgs, rec.Messages...)
		runs = append(runs, rec.Runs...)
	}
	// Records are shared (recordCache) and never change: the hot tail gets copies.
	msgs = thread.Transcript{Messages: msgs}.Clone().Messages
	t.Transcript.Messages = append(msgs, t.Transcript.Messages...)
	t.Runs = append(runs, t.Runs...)
	first := refs[0]
	if first.From == 0 {
		t.Sealed = nil
		return nil
	}
	// The records before first: those of Recent, or of the segment that holds first.
	if i := slices.IndexFunc(sealed.Recent, func(r RecordRef) bool { return r.ID == first.ID }); i >= 0 {
		sealed.Recent = sealed.Recent[:i:i]
	} else {
		sealed.Recent = nil
		for seg := sealed.Last; seg != nil; {
			sg, err := readRef[threadSegment](ctx, s, key, *seg)
			if err != nil {
				return err
			}
			if i := slices.IndexFunc(sg.Records, func(r RecordRef) bool { return r.ID == first.ID }); i >= 0 {
				sealed.Recent, sealed.Last = slices.Clone(sg.Records[:i]), sg.Prev
				break
			}
			seg = sg.Prev
		}
	}
	last, err := s.sealedRange(ctx, key, &sealed, nil, max(first.From-newestSealed, 0), first.From)
	if err != nil {
		return err
	}
	sealed.Count, sealed.Newest = first.From, newest(last)
	sealed.Lead = sealed.Lead[:min(len(sealed.Lead), sealed.Count)]
	t.Sealed = &sealed
	return nil
}

// knownInput returns a run's input (RunAgentInput JSON) without the messages of t that its
// hot tail no longer holds, so that Transcript.Accept, which knows the hot tail only, merges
// it as it would the whole transcript. The messages a client posts that the thread knows
// come before those it does not (the whole transcript, its newest messages, a stale copy of
// it, each followed by new ones): everything before the first message the hot tail holds is
// sealed. When the hot tail holds none, the last posted message the thread sealed (findSealed,
// unless the list is one message) ends the known ones, and an assistant message posted after it and before the list's last user
// message is the client's copy of a sealed reply (one the client named itself: a reply
// created lazily, by reasoning or a tool call). If the last known message is the list's last
// user, system or assistant message, the list is a regenerate from a sealed message: it is
// unsealed, for Accept to cut what follows it.
func (s *Store) knownInput(ctx context.Context, key string, t *Thread, input json.RawMessage) (json.RawMessage, error) {
	if t.Sealed == nil {
		return input, nil
	}
	msgs := postedMessages(input)
	if len(msgs) == 0 {
		return input, nil
	}
	hot := func(id string) bool {
		return slices.ContainsFunc(t.Transcript.Messages, func(m thread.Message) bool { return m.ID == id })
	}
	keep := make([]bool, len(msgs))
	first := slices.IndexFunc(msgs, func(m postedMessage) bool { return hot(m.ID) })
	if first < 0 {
		last, lastUser := -1, -1 // the last user, system or assistant message; the last user one
		for i, m := range msgs {
			switch m.Role {
			case "user":
				lastUser = i
				fallthrough
			case "system", "assistant":
				last = i
			}
		}
		// The newest posted message the thread sealed: among the head's newest sealed ones,
		// else (a list of more than one message, none of them known there: a stale copy, a
		// regenerate or an edit far back) searched in the records. A lone message that is
		// neither is new.
		ids := map[string]bool{}
		for _, m := range msgs {
			if m.ID != "" {
				ids[m.ID] = true
			}
		}
		known, pos := -1, -1
		for i := len(msgs) - 1; i >= 0 && known < 0; i-- {
			if pos = t.Sealed.newestAt(msgs[i].ID); pos >= 0 {
				known = i
			}
		}
		if known < 0 && len(ids) > 1 {
			var id string
			var err error
			if pos, id, err = s.findSealed(ctx, key, t.Sealed, ids); err != nil {
				return nil, err
			}
			known = slices.IndexFunc(msgs, func(m postedMessage) bool { return m.ID == id })
		}
		if known >= 0 && known == last {
			// A regenerate from a sealed message: Accept cuts what follows it.
			if err := s.unseal(ctx, key, t, pos); err != nil {
				return nil, err
			}
			first = slices.IndexFunc(msgs, func(m postedMessage) bool { return hot(m.ID) })
		}
		if first < 0 {
			for i := known + 1; i < len(msgs); i++ {
				keep[i] = known < 0 || msgs[i].Role == "user" || msgs[i].Role == "system" || i > lastUser
			}
		}
	}
	if first >= 0 {
		for i := first; i < len(msgs); i++ {
			keep[i] = true
		}
	}
	if !slices.Contains(keep, false) {
		return input, nil
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, fmt.Errorf("thread: accept: %w", err)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(in["messages"], &raw); err != nil {
		return nil, fmt.Errorf("thread: accept: %w", err)
	}
	var kept []json.RawMessage
	for i, m := range raw {
		if keep[i] {
			kept = append(kept, m)
		}
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, err
	}
	in["messages"] = b
	return json.Marshal(in)
}

// AllRuns returns every run of t, in order of acceptance: those its records hold, then its
// head's.
func (s *Store) AllRuns(ctx context.Context, t *Thread) ([]ThreadRun, error) {
	if t.Sealed == nil {
		return t.Runs, nil
	}
	key := threadKey(t.Principal, t.ThreadID)
	var refs []RecordRef
	if err := s.refs(ctx, key, t.Sealed, nil, func(r RecordRef) bool { refs = append(refs, r); return true }); err != nil {
		return nil, err
	}
	slices.Reverse(refs)
	recs, err := s.readRecords(ctx, key, refs)
	if err != nil {
		return nil, err
	}
	var runs []ThreadRun
	for _, rec := range recs {
		runs = append(runs, rec.Runs...)
	}
	return append(runs, t.Runs...), nil
}

// postedMessage is what knownInput reads of a posted message.
type postedMessage struct {
	ID   string `json:"id"`
	Role string `json:"role"`
}

// postedMessages returns the messages of a run's input (nil if it has none, or is not valid:
// Accept says why).
func postedMessages(input json.RawMessage) []postedMessage {
	var in struct {
		Messages []postedMessage `json:"messages"`
	}
	json.Unmarshal(input, &in)
	return in.Messages
}

// sealedAgentMessages returns the newest of t's sealed messages as an agent is given them
// (thread.AgentMessages), oldest first: those of the newest records that hold at least budget
// bytes of JSON if it has as many (all of them for budget <= 0), after its leading system
// messages (Sealed.Lead) when those records do not reach back to them. It returns nil for a
// thread with none sealed. Each record is converted once (threadRecord.agentMessages).
func (s *Store) sealedAgentMessages(ctx context.Context, t *Thread, budget int) ([]protocol.Message, error) {
	if t == nil || t.Sealed == nil {
		return nil, nil
	}
	key := threadKey(t.Principal, t.ThreadID)
	var refs []RecordRef
	size := 0
	if err := s.refs(ctx, key, t.Sealed, nil, func(r RecordRef) bool {
		refs, size = append(refs, r), size+r.Bytes
		return budget <= 0 || size < budget
	}); err != nil {
		return nil, err
	}
	slices.Reverse(refs)
	recs, err := s.readRecords(ctx, key, refs)
	if err != nil {
		return nil, err
	}
	from, held := t.Sealed.Count, 0
	if len(refs) > 0 {
		from = refs[0].From
	}
	out := thread.AgentMessages(t.Sealed.Lead[:min(len(t.Sealed.Lead), from)])
	converted := make([][]protocol.Message, len(recs))
	n := len(out)
	for i, rec := range recs {
		msgs, size := rec.agentMessages()
		s.records.grow(refs[i].ID, size)
		converted[i] = msgs
		n += len(msgs)
		held += len(rec.Messages)
	}
	out = slices.Grow(out, n-len(out))
	for _, msgs := range converted {
		out = append(out, msgs...)
	}
	if held != t.Sealed.Count-from {
		return nil, fmt.Errorf("thread: records hold %d of the messages %d to %d", held, from, t.Sealed.Count)
	}
	return out, nil
}

// Active returns what a hydrate shows of t while runID is running, given its events so far:
// Transcript.Active of its hot tail, with the role of the last sealed message before it, so
// that a continuation's placeholder is there when the hot tail is empty.
func (t *Thread) Active(runID string, events []json.RawMessage) []thread.Message {
	tr := t.Transcript
	if len(tr.Messages) > 0 || t.Sealed == nil || len(t.Sealed.Newest) == 0 {
		return tr.Active(runID, events)
	}
	last := t.Sealed.Newest[len(t.Sealed.Newest)-1]
	tr.Messages = []thread.Message{{ID: last.ID, Role: last.Role, Parts: []thread.Part{}}}
	return tr.Active(runID, events)[1:]
}

// sealedCursor is a page cursor inside the sealed messages: the messages before position P,
// Seg the segment that holds position P-1 (nil: the head's Recent). On the wire it is
// cursorPrefix and its JSON in base64url; any other cursor is a message id.
type sealedCursor struct {
	P   int        `json:"p"`
	Seg *RecordRef `json:"s,omitempty"`
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
	if err != nil || json.Unmarshal(b, &c) != nil || c.P <= 0 || c.Seg != nil && (c.Seg.ID == "" || c.Seg.N <= 0) {
		return sealedCursor{}, false
	}
	return c, true
}

// threadPage cuts a page of t's messages, newest window first, as thread.Page cuts a
// transcript, reading the records of its window: hot is t's hot tail as the hydrate shows
// it (with an active run's message). limit <= 0 answers every message (every record read)
// and cursor "". before is "" for the newest window, or a cursor threadPage issued: the
// window then holds the newest limit messages strictly older than it. A cursor naming no
// message of the thread answers an empty window and "".
func (s *Store) threadPage(ctx context.Context, t *Thread, hot []thread.Message, limit int, before string) (window []thread.Message, cursor string, err error) {
	if t.Sealed == nil {
		w, c := thread.Page(hot, limit, before)
		return w, c, nil
	}
	key := threadKey(t.Principal, t.ThreadID)
	sealed := t.Sealed
	count := sealed.Count
	end := count + len(hot) // the window's end, as a position
	var seg *RecordRef      // the segment that holds end-1, when known
	if before != "" {
		if i := slices.IndexFunc(hot, func(m thread.Message) bool { return m.ID == before }); i >= 0 {
			end = count + i
		} else if c, ok := parseSealedCursor(before); ok && c.P <= count {
			end, seg = c.P, c.Seg
		} else {
			// A message id: a cursor issued while its message was hot, sealed since.
			pos, _, err := s.findSealed(ctx, key, sealed, map[string]bool{before: true})
			if err != nil || pos < 0 {
				return []thread.Message{}, "", err
			}
			end = pos
		}
	}
	start := 0
	if limit > 0 {
		start = max(end-min(limit, thread.MaxPage), 0)
	}
	if start >= count {
		window = slices.Clone(hot[start-count : end-count])
	} else {
		if window, err = s.sealedRange(ctx, key, sealed, seg, start, min(end, count)); err != nil {
			return nil, "", err
		}
		if end > count {
			window = append(window, hot[:end-count]...)
		}
	}
	switch {
	case start == 0:
	case start >= count:
		cursor = hot[start-count].ID
	default:
		cursor = sealedCursor{P: start, Seg: s.segmentOf(ctx, key, sealed, seg, start-1)}.String()
	}
	return window, cursor, nil
}

// segmentOf returns the segment that holds position pos, nil when the head's Recent does (or
// the segments cannot be read: a page then walks from the newest).
func (s *Store) segmentOf(ctx context.Context, key string, sealed *Sealed, from *RecordRef, pos int) *RecordRef {
	if len(sealed.Recent) > 0 && sealed.Recent[0].From <= pos {
		return nil
	}
	seg := sealed.Last
	if from != nil {
		seg = from
	}
	for seg != nil {
		if seg.From <= pos {
			return seg
		}
		sg, err := readRef[threadSegment](ctx, s, key, *seg)
		if err != nil {
			return nil
		}
		seg = sg.Prev
	}
	return nil
}

// recordCache keeps decoded records and segments, which never change, by ID, for the reads
// that follow: a turn's agent reads the newest records of its thread, and so do the next
// turns' and the hydrates of a reload. It holds each for keptFor since its last use, and at
// most recordCacheBytes (by their JSON's size), the least recently used going first: like
// the thread values a store keeps (keep.go), what an idle gateway holds goes soon.
type recordCache struct {
	mu    sync.Mutex
	by    map[string]*list.Element
	order list.List // of *cachedRecord, most recently used first
	size  int
	timer *time.Timer
}

type cachedRecord struct {
	id   string
	v    any // *threadRecord or *threadSegment
	size int
	at   time.Time // last used
}

const recordCacheBytes = 32 << 20

func (c *recordCache) add(id string, v any, size int) {
	if size > recordCacheBytes/4 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]*list.Element{}
	}
	if e, ok := c.by[id]; ok {
		e.Value.(*cachedRecord).at = now
		c.order.MoveToFront(e)
		return
	}
	c.by[id] = c.order.PushFront(&cachedRecord{id, v, size, now})
	c.size += size
	c.trimLocked(now)
	if c.timer == nil {
		c.timer = time.AfterFunc(keptFor, c.sweep)
	}
}

func (c *recordCache) get(id string) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.useLocked(id, time.Now())
}

// useLocked returns id's entry (nil when not kept), marked used at now.
func (c *recordCache) useLocked(id string, now time.Time) any {
	e, ok := c.by[id]
	if !ok {
		return nil
	}
	cr := e.Value.(*cachedRecord)
	cr.at = now
	c.order.MoveToFront(e)
	return cr.v
}

// getRecords sets recs[i] to the record refs[i] names where the cache holds it, under one
// lock: an agent's context reads every record of its window, every turn.
func (c *recordCache) getRecords(refs []RecordRef, recs []*threadRecord) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range refs {
		recs[i], _ = c.useLocked(r.ID, now).(*threadRecord)
	}
}

// grow adds n bytes to the size of id's entry, if it is kept: what was computed from it
// (threadRecord.agentMessages).
func (c *recordCache) grow(id string, n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.by[id]; ok {
		e.Value.(*cachedRecord).size += n
		c.size += n
		c.trimLocked(time.Now())
	}
}

// trimLocked drops, least recently used first, what was not used for keptFor and what
// exceeds recordCacheBytes.
func (c *recordCache) trimLocked(now time.Time) {
	for e := c.order.Back(); e != nil; e = c.order.Back() {
		cr := e.Value.(*cachedRecord)
		if c.size <= recordCacheBytes && now.Sub(cr.at) < keptFor {
			return
		}
		c.order.Remove(e)
		delete(c.by, cr.id)
		c.size -= cr.size
	}
}

// sweep drops what was not used for keptFor, and comes again while anything is kept.
func (c *recordCache) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trimLocked(time.Now())
	c.timer = nil
	if c.order.Len() > 0 {
		c.timer = time.AfterFunc(keptFor, c.sweep)
	}
}
