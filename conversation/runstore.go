package conversation

import (
	"context"
	"errors"
	"time"

	"github.com/wsgateway/wsgateway/jetstream"
)

// RunStore returns s as a Store.
func RunStore(s *jetstream.Store) Store { return runStore{s} }

// runStore is a *jetstream.Store as a Store: its values as the conversation's, its errors
// matching the conversation's too (storeErr).
type runStore struct{ s *jetstream.Store }

func (s runStore) Create(ctx context.Context, principal, runID, threadID string, input []byte) (RunLog, error) {
	var opts []jetstream.CreateOption
	if input != nil {
		opts = append(opts, jetstream.WithInput(input))
	}
	w, err := s.s.Create(ctx, principal, runID, threadID, opts...)
	if err != nil {
		return nil, storeErr(err)
	}
	return runLog{w}, nil
}

func (s runStore) Read(ctx context.Context, principal, runID, after string) (LogReader, error) {
	r, err := s.s.Read(ctx, principal, runID, after)
	if err != nil {
		return nil, storeErr(err)
	}
	return logReader{r}, nil
}

func (s runStore) LastEvent(ctx context.Context, principal, runID string) ([]byte, error) {
	e, err := s.s.LastEvent(ctx, principal, runID)
	return e, storeErr(err)
}

func (s runStore) Snapshot(ctx context.Context, principal, runID string) ([]Entry, bool, error) {
	entries, closed, err := s.s.Snapshot(ctx, principal, runID)
	return entriesOf(entries), closed, storeErr(err)
}

func (s runStore) Ended(ctx context.Context, principal, runID string) (bool, error) {
	ended, err := s.s.Ended(ctx, principal, runID)
	return ended, storeErr(err)
}

func (s runStore) RequestAbort(principal, runID, origin string) error {
	return s.s.RequestAbort(principal, runID, origin)
}

func (s runStore) OnAbort(f func(principal, runID, origin string, interrupt bool)) error {
	return s.s.OnAbort(f)
}

func (s runStore) RequestInterrupt(principal, runID string) error {
	return s.s.RequestInterrupt(principal, runID)
}

func (s runStore) OnTakeover(f func(Takeover) bool) {
	s.s.OnTakeover(func(tk jetstream.Takeover) bool {
		return f(Takeover{Info: infoOf(tk.Info), Input: tk.Input, Stored: entriesOf(tk.Stored), Log: runLog{tk.Writer}})
	})
}

func (s runStore) ThreadKey(principal, threadID string) string {
	return s.s.ThreadKey(principal, threadID)
}

func (s runStore) Announce(key string, run Announcement) error {
	return s.s.Announce(key, jetstream.Announcement(run))
}

func (s runStore) SubscribeThread(key string, f func(Announcement)) (func(), error) {
	return s.s.SubscribeThread(key, func(a jetstream.Announcement) { f(Announcement(a)) })
}

func (s runStore) QueryThread(key string, wait time.Duration, f func([]Announcement)) (func(), error) {
	return s.s.QueryThread(key, wait, func(runs []jetstream.Announcement) {
		out := make([]Announcement, len(runs))
		for i, a := range runs {
			out[i] = Announcement(a)
		}
		f(out)
	})
}

func (s runStore) OnThreadQuery(running func(key string) []Announcement) error {
	return s.s.OnThreadQuery(func(key string) []jetstream.Announcement {
		runs := running(key)
		out := make([]jetstream.Announcement, len(runs))
		for i, a := range runs {
			out[i] = jetstream.Announcement(a)
		}
		return out
	})
}

// runLog is a *jetstream.Writer as a RunLog.
type runLog struct{ *jetstream.Writer }

func (w runLog) Info() RunInfo { return infoOf(w.Writer.Info()) }

// logReader is a *jetstream.Reader as a LogReader.
type logReader struct{ *jetstream.Reader }

func (r logReader) Next(ctx context.Context) (Entry, error) {
	e, err := r.Reader.Next(ctx)
	return Entry(e), storeErr(err)
}

func infoOf(i jetstream.RunInfo) RunInfo {
	return RunInfo{Principal: i.Principal, RunID: i.RunID, Generation: i.Generation, Takeovers: i.Takeovers,
		TraceParent: i.TraceParent, TraceState: i.TraceState}
}

func entriesOf(entries []jetstream.Entry) []Entry {
	if entries == nil {
		return nil
	}
	out := make([]Entry, len(entries))
	for i, e := range entries {
		out[i] = Entry(e)
	}
	return out
}

// storeErr returns err matching, besides what it matches, the conversation's error it
// stands for (ErrForbidden, ErrUnknownRun, ErrInvalidOffset); nil for nil.
func storeErr(err error) error {
	if err == nil {
		return nil
	}
	for _, m := range [...]struct{ js, own error }{
		{jetstream.ErrForbidden, ErrForbidden},
		{jetstream.ErrUnknownRun, ErrUnknownRun},
		{jetstream.ErrInvalidOffset, ErrInvalidOffset},
	} {
		if errors.Is(err, m.js) {
			return matched{own: m.own, err: err}
		}
	}
	return err
}

// matched is an error of the run log store that matches the conversation's error own too.
type matched struct{ own, err error }

func (e matched) Error() string   { return e.err.Error() }
func (e matched) Unwrap() []error { return []error{e.own, e.err} }
