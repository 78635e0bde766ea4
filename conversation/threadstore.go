package conversation

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/threadstore"
)

// ThreadStore returns s as the Threads of a Server.
func ThreadStore(s *threadstore.Store) Threads { return threadStore{s} }

// threadStore is a *threadstore.Store as Threads: its threads are *threadstore.Thread as
// storeThread, its reads ahead *threadstore.ThreadAhead as storeAhead.
type threadStore struct{ s *threadstore.Store }

type storeThread struct{ t *threadstore.Thread }

type storeAhead struct{ a *threadstore.ThreadAhead }

// threadOf returns t as a Thread, nil for nil.
func threadOf(t *threadstore.Thread, err error) (Thread, error) {
	if t == nil {
		return nil, threadErr(err)
	}
	return storeThread{t}, threadErr(err)
}

// storeThreadOf returns the *threadstore.Thread of t, an empty one for nil.
func storeThreadOf(t Thread) *threadstore.Thread {
	if t == nil {
		return &threadstore.Thread{}
	}
	return t.(storeThread).t
}

func (s threadStore) ReadThreadAhead(ctx context.Context, principal, threadID string) ThreadAhead {
	return storeAhead{s.s.ReadThreadAhead(ctx, principal, threadID)}
}

func (s threadStore) AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, ahead ThreadAhead, o Overlap) (Thread, error) {
	var a *threadstore.ThreadAhead
	if ahead != nil {
		a = ahead.(storeAhead).a
	}
	return threadOf(s.s.AcceptRun(ctx, principal, threadID, runID, input, a,
		threadstore.Overlap{Ended: threadstore.Ended(o.Ended), Queue: o.Queue, Rollback: o.Rollback}))
}

func (s threadStore) FinishRun(ctx context.Context, principal, threadID, runID string, events []json.RawMessage) error {
	return threadErr(s.s.FinishRun(ctx, principal, threadID, runID, events))
}

func (s threadStore) Thread(ctx context.Context, principal, threadID string) (Thread, error) {
	return threadOf(s.s.Thread(ctx, principal, threadID))
}

func (s threadStore) Threads(ctx context.Context, principal string) ([]ThreadSummary, error) {
	list, err := s.s.Threads(ctx, principal)
	out := make([]ThreadSummary, len(list))
	for i, t := range list {
		out[i] = ThreadSummary(t)
	}
	return out, threadErr(err)
}

func (s threadStore) DeleteThread(ctx context.Context, principal, threadID string) error {
	return threadErr(s.s.DeleteThread(ctx, principal, threadID))
}

func (s threadStore) SwitchBranch(ctx context.Context, principal, threadID, messageID string) (Thread, error) {
	return threadOf(s.s.SwitchBranch(ctx, principal, threadID, messageID))
}

func (s threadStore) Hydrate(ctx context.Context, t Thread, activeRun string, active []json.RawMessage, limit int, before string) (HydratePage, error) {
	p, err := s.s.Hydrate(ctx, storeThreadOf(t), activeRun, active, limit, before)
	return HydratePage(p), threadErr(err)
}

func (s threadStore) AgentMessages(ctx context.Context, t Thread, runID string, earlier []RunEvents, posted []protocol.Message, budget int) ([]protocol.Message, Window, error) {
	runs := make([]threadstore.RunEvents, len(earlier))
	for i, r := range earlier {
		runs[i] = threadstore.RunEvents(r)
	}
	msgs, w, err := s.s.AgentMessages(ctx, storeThreadOf(t), runID, runs, posted, budget)
	return msgs, Window(w), threadErr(err)
}

func (t storeThread) Runs() []ThreadRun {
	out := make([]ThreadRun, len(t.t.Runs))
	for i, r := range t.t.Runs {
		out[i] = ThreadRun{RunID: r.RunID, State: r.State}
	}
	return out
}

func (t storeThread) ActiveRun() string                 { return t.t.ActiveRun() }
func (t storeThread) RunState(runID string) string      { return t.t.RunState(runID) }
func (t storeThread) Ahead(runID string) int            { return t.t.Ahead(runID) }
func (t storeThread) EarlierRuns(runID string) []string { return t.t.EarlierRuns(runID) }

func (a storeAhead) BusyWith(ctx context.Context, principal, threadID, runID string, ended Ended) (string, error) {
	h, err := a.a.Head(ctx, principal, threadID)
	if err != nil {
		return "", threadErr(err)
	}
	return h.BusyWith(ctx, runID, threadstore.Ended(ended))
}

// threadErr returns err matching, besides what it matches, the conversation's error it
// stands for (ErrUnknownThread, ErrThreadLimit, ErrUnknownMessage, a *BusyError); nil for
// nil.
func threadErr(err error) error {
	if err == nil {
		return nil
	}
	var busy *threadstore.BusyError
	if errors.As(err, &busy) {
		return matched{own: &BusyError{ActiveRun: busy.ActiveRun}, err: err}
	}
	for _, m := range [...]struct{ store, own error }{
		{threadstore.ErrUnknownThread, ErrUnknownThread},
		{threadstore.ErrThreadLimit, ErrThreadLimit},
		{threadstore.ErrUnknownMessage, ErrUnknownMessage},
	} {
		if errors.Is(err, m.store) {
			return matched{own: m.own, err: err}
		}
	}
	return err
}
