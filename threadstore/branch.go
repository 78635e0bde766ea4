package threadstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/thread"
)

// Branches (docs/THREADS.md section 7). A thread is a tree of messages with one active leaf:
// its transcript is the active branch. Where a regenerate or an edit forked it, a Fork names
// the message the branches follow and its children, the first message of each branch, in
// order of creation. The active child's messages are the transcript's; every other child's
// (the branch as it was when it left the transcript, to its leaf) is a record of its own,
// written once like a sealed one (log.go) and named by the child's Ref.

// ErrUnknownMessage reports a message that no branch of the thread holds.
var ErrUnknownMessage = errors.New("thread: unknown message")

// Fork is a message that several branches follow.
type Fork struct {
	After    string  `json:"after"` // the message the branches follow ("" the thread's start)
	Children []Child `json:"children"`
}

// Child is the first message of one branch at a fork. Ref names the record of its messages
// when the branch is not the active one; nil when it is.
type Child struct {
	First string     `json:"first"`
	Ref   *RecordRef `json:"ref,omitempty"`
}

// fork returns t's fork after id, nil when t has none.
func (t *Thread) fork(after string) *Fork {
	for i := range t.Forks {
		if t.Forks[i].After == after {
			return &t.Forks[i]
		}
	}
	return nil
}

// keepCut writes what the run's acceptance cut from t's transcript (thread.Transcript.Cut) as
// a branch of t, beside the one the run continues, and reports whether there was one.
func (s *Store) keepCut(ctx context.Context, key string, t *Thread) (bool, error) {
	c := t.Transcript.Cut
	t.Transcript.Cut = nil
	if c == nil || len(c.Messages) == 0 {
		return false, nil
	}
	ref, err := s.writeRecord(ctx, key, &threadRecord{Messages: c.Messages}, 0)
	if err != nil {
		return false, fmt.Errorf("thread: keeping a branch: %w", err)
	}
	t.stash(c.After, c.Messages[0].ID, ref)
	return true, nil
}

// announceBranch tells the thread's followers, on every gateway, that its active branch is
// now the one holding messageID (a thread.branch frame).
func (s *Store) announceBranch(principal, threadID, messageID string) {
	if err := s.runs.Announce(s.runs.ThreadKey(principal, threadID), jetstream.Announcement{Branch: messageID}); err != nil {
		s.log.Warn("threadstore: announcing a thread's branch", keyErr, err)
	}
}

// stash names ref as the record of the branch that starts with first after the message
// after, which leaves the transcript.
func (t *Thread) stash(after, first string, ref RecordRef) {
	f := t.fork(after)
	if f == nil {
		t.Forks = append(t.Forks, Fork{After: after})
		f = &t.Forks[len(t.Forks)-1]
	}
	if i := slices.IndexFunc(f.Children, func(c Child) bool { return c.First == first }); i >= 0 {
		f.Children[i].Ref = &ref
	} else {
		f.Children = append(f.Children, Child{First: first, Ref: &ref})
	}
}

// settleForks names, at each fork whose active branch its children lack (a regenerate's or
// an edit's new branch, which began after the fork was written), the message that follows
// the fork in the transcript's hot tail: that branch is the newest child.
func (t *Thread) settleForks() {
	for i := range t.Forks {
		f := &t.Forks[i]
		if slices.ContainsFunc(f.Children, func(c Child) bool { return c.Ref == nil }) {
			continue
		}
		msgs := t.Transcript.Messages
		at := -1
		if f.After != "" {
			if at = slices.IndexFunc(msgs, func(m thread.Message) bool { return m.ID == f.After }); at < 0 {
				continue
			}
		} else if t.Sealed != nil {
			continue
		}
		if at+1 < len(msgs) {
			f.Children = append(f.Children, Child{First: msgs[at+1].ID})
		}
	}
}

// Branch is where a message stands among its siblings: Index of Count, 1-based, in order of
// creation, and Siblings, the ids of each one's first message in that order, for a switch
// (the message's metadata.branch in a hydrate).
type Branch struct {
	Index    int      `json:"index"`
	Count    int      `json:"count"`
	Siblings []string `json:"siblings"`
}

// branches returns, by message id, the branch of every active child of t's forks. msgs are
// the messages a hydrate shows: a fork whose active branch its children lack yet (a
// regenerate's reply still streaming) counts the message that follows the fork there.
func (t *Thread) branches(msgs []thread.Message) map[string]Branch {
	var out map[string]Branch
	for _, f := range t.Forks {
		children := f.Children
		if !slices.ContainsFunc(children, func(c Child) bool { return c.Ref == nil }) {
			if at := slices.IndexFunc(msgs, func(m thread.Message) bool { return m.ID == f.After }); f.After != "" && at >= 0 && at+1 < len(msgs) {
				children = append(slices.Clip(children), Child{First: msgs[at+1].ID})
			}
		}
		for i, c := range children {
			if c.Ref == nil && len(children) > 1 {
				if out == nil {
					out = map[string]Branch{}
				}
				b := Branch{Index: i + 1, Count: len(children)}
				for _, c := range children {
					b.Siblings = append(b.Siblings, c.First)
				}
				out[c.First] = b
			}
		}
	}
	return out
}

// withBranches returns msgs with metadata.branch set on those that start a branch among
// siblings (the slice and the messages changed are copies: records are shared).
func withBranches(msgs []thread.Message, branches map[string]Branch) []thread.Message {
	if len(branches) == 0 {
		return msgs
	}
	out := msgs
	copied := false
	for i, m := range msgs {
		b, ok := branches[m.ID]
		if !ok {
			continue
		}
		md := map[string]json.RawMessage{}
		if len(m.Metadata) > 0 && json.Unmarshal(m.Metadata, &md) != nil {
			continue
		}
		md["branch"], _ = json.Marshal(b)
		raw, err := json.Marshal(md)
		if err != nil {
			continue
		}
		if !copied {
			out, copied = slices.Clone(msgs), true
		}
		out[i].Metadata = raw
	}
	return out
}

// SwitchBranch makes the branch that holds messageID the thread's active one, to that
// branch's leaf, for every reader: the branches it leaves are kept as siblings. It returns
// ErrUnknownMessage for a message no branch holds, ErrUnknownThread for a thread the
// principal does not have, and a *BusyError while a run of the thread is active (its reply
// goes into the active branch) or, for a switch to another branch, paused for an answer (an
// approval) that its branch asks.
func (s *Store) SwitchBranch(ctx context.Context, principal, threadID, messageID string) (*Thread, error) {
	key := threadKey(principal, threadID)
	var written, settled *Thread
	err := s.updateThread(ctx, principal, threadID, nil, func(t *Thread, exists bool) (bool, error) {
		written, settled = nil, nil
		if !exists {
			return false, ErrUnknownThread
		}
		if r := t.runningRun(); r != "" {
			return false, &BusyError{ActiveRun: r}
		}
		changed, err := s.activate(ctx, key, t, messageID, 0)
		if err != nil {
			return false, err
		}
		if in := t.Transcript.Interrupts; changed && in != nil {
			// A run paused for an answer (an approval) in the branch it would leave.
			return false, &BusyError{ActiveRun: in.RunID}
		}
		if changed {
			t.Updated = time.Now().UTC()
			settled = &Thread{ThreadHead: t.ThreadHead, Sealed: t.Sealed, Forks: cloneForks(t.Forks)}
			settled.Runs = slices.Clone(t.Runs)
			settled.Transcript.Messages = thread.Transcript{Messages: t.Transcript.Messages[:sealable(t)]}.Clone().Messages
		}
		written = &Thread{ThreadHead: t.ThreadHead, Transcript: t.Transcript.Clone(), Sealed: t.Sealed, Forks: cloneForks(t.Forks)}
		written.Runs = slices.Clone(t.Runs)
		return changed, nil
	})
	if err != nil {
		return nil, err
	}
	if settled != nil { // changed
		s.sealLater(principal, threadID, settled)
		s.announceBranch(principal, threadID, messageID)
	}
	return written, nil
}

// cloneForks returns a copy of forks that shares nothing an update changes.
func cloneForks(forks []Fork) []Fork {
	out := slices.Clone(forks)
	for i := range out {
		out[i].Children = slices.Clone(out[i].Children)
	}
	return out
}

// runningRun returns a run of t that is running or queued, "" when none.
func (t *Thread) runningRun() string {
	for _, r := range slices.Backward(t.Runs) {
		if active(r.State) {
			return r.RunID
		}
	}
	return ""
}

// maxForkDepth bounds the forks activate walks up from a message (a branch inside a branch).
const maxForkDepth = 64

// activate makes the branch holding id active in t, making the branch of its fork's message
// active first; it reports whether it changed t.
func (s *Store) activate(ctx context.Context, key string, t *Thread, id string, depth int) (bool, error) {
	if depth > maxForkDepth {
		return false, fmt.Errorf("thread: branches nested deeper than %d", maxForkDepth)
	}
	fi, ci, err := s.stashed(ctx, key, t, id)
	if err != nil {
		return false, err
	}
	if fi < 0 {
		// Not in a stashed branch: in the active one, or nowhere.
		if slices.ContainsFunc(t.Transcript.Messages, func(m thread.Message) bool { return m.ID == id }) {
			return false, nil
		}
		if t.Sealed != nil {
			pos, _, err := s.findSealed(ctx, key, t.Sealed, map[string]bool{id: true})
			if err != nil {
				return false, err
			}
			if pos >= 0 {
				return false, nil
			}
		}
		return false, ErrUnknownMessage
	}
	after := t.Forks[fi].After
	if after != "" {
		if _, err := s.activate(ctx, key, t, after, depth+1); err != nil {
			return false, err
		}
		if fi, ci, err = s.stashed(ctx, key, t, id); err != nil || fi < 0 {
			return false, cmp.Or(err, fmt.Errorf("thread: branch of %s lost while switching", id))
		}
	}
	return true, s.swap(ctx, key, t, fi, ci)
}

// stashed returns the fork and child of t whose stashed branch holds id; -1, -1 when none.
func (s *Store) stashed(ctx context.Context, key string, t *Thread, id string) (int, int, error) {
	for fi, f := range t.Forks {
		for ci, c := range f.Children {
			if c.Ref == nil {
				continue
			}
			if c.First == id {
				return fi, ci, nil
			}
			rec, err := readRef[threadRecord](ctx, s, key, *c.Ref)
			if err != nil {
				return -1, -1, err
			}
			if slices.ContainsFunc(rec.Messages, func(m thread.Message) bool { return m.ID == id }) {
				return fi, ci, nil
			}
		}
	}
	return -1, -1, nil
}

// swap makes child ci of fork fi active: the transcript from the fork's message on becomes
// that child's branch, and what it held there is stashed as the branch it was.
func (s *Store) swap(ctx context.Context, key string, t *Thread, fi, ci int) error {
	f := &t.Forks[fi]
	in, err := readRef[threadRecord](ctx, s, key, *f.Children[ci].Ref)
	if err != nil {
		return err
	}
	// The fork's message, and what follows it, into the hot tail.
	at := -1
	if f.After != "" {
		at = slices.IndexFunc(t.Transcript.Messages, func(m thread.Message) bool { return m.ID == f.After })
	}
	if at < 0 && t.Sealed != nil {
		pos := 0
		if f.After != "" {
			if pos, _, err = s.findSealed(ctx, key, t.Sealed, map[string]bool{f.After: true}); err != nil {
				return err
			}
			if pos < 0 {
				return fmt.Errorf("thread: the message %s that branches follow is gone", f.After)
			}
		}
		if err := s.unseal(ctx, key, t, pos); err != nil {
			return err
		}
		if f.After != "" {
			at = slices.IndexFunc(t.Transcript.Messages, func(m thread.Message) bool { return m.ID == f.After })
		}
	}
	msgs := t.Transcript.Messages
	out := slices.Clone(msgs[at+1:])
	if len(out) > 0 {
		ref, err := s.writeRecord(ctx, key, &threadRecord{Messages: out}, 0)
		if err != nil {
			return fmt.Errorf("thread: keeping a branch: %w", err)
		}
		t.stash(f.After, out[0].ID, ref)
		f = &t.Forks[fi]
	}
	// Records are shared (recordCache) and never change: the hot tail gets copies.
	t.Transcript.Messages = append(msgs[:at+1:at+1], thread.Transcript{Messages: in.Messages}.Clone().Messages...)
	f.Children[ci].Ref = nil
	return nil
}

// refreshForks writes the stashed branches of forks again under new IDs, as refresh does the
// sealed records, and returns forks naming them (nil when there are none).
func (s *Store) refreshForks(ctx context.Context, key string, forks []Fork) ([]Fork, error) {
	if len(forks) == 0 {
		return nil, nil
	}
	out := cloneForks(forks)
	for i := range out {
		for j, c := range out[i].Children {
			if c.Ref == nil {
				continue
			}
			rec, err := readRef[threadRecord](ctx, s, key, *c.Ref)
			if err != nil {
				return nil, err
			}
			ref, err := s.writeRecord(ctx, key, rec, 0)
			if err != nil {
				return nil, err
			}
			out[i].Children[j].Ref = &ref
		}
	}
	return out, nil
}

// sameForks reports whether a and b name the same branches, stashed in the same records.
func sameForks(a, b []Fork) bool {
	return slices.EqualFunc(a, b, func(x, y Fork) bool {
		return x.After == y.After && slices.EqualFunc(x.Children, y.Children, func(c, d Child) bool {
			return c.First == d.First && (c.Ref == nil) == (d.Ref == nil) && (c.Ref == nil || c.Ref.ID == d.Ref.ID)
		})
	})
}
