package threadstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
)

// What a thread answers its readers: a hydrate's page, and a run's agent's messages. Both are
// built here, so that no other package reads a transcript.

// HydratePage is a page of a thread as a hydrate answers it (docs/THREADS.md section 1), in
// the JSON of the answer.
type HydratePage struct {
	Messages   json.RawMessage // the page's messages, oldest first: a JSON array
	Interrupts json.RawMessage // the thread's pending interrupts: a JSON object, or null
	Cursor     string          // the page before this one ("" at the thread's start, or with no limit)
}

// Hydrate returns the page of t's messages that limit and before name (as threadPage takes
// them), with active, the events stored so far of activeRun, the run t holds as active ("":
// none), applied to its hot tail. When the records of the page cannot be read, it answers
// the page of the hot tail alone, and the error.
func (s *Store) Hydrate(ctx context.Context, t *Thread, activeRun string, active []json.RawMessage, limit int, before string) (HydratePage, error) {
	hot := t.Transcript.Messages
	if activeRun != "" {
		hot = t.Active(activeRun, active)
	}
	msgs, cursor, err := s.threadPage(ctx, t, hot, limit, before)
	if err != nil {
		msgs, cursor = thread.Page(hot, limit, before)
	}
	if msgs == nil {
		msgs = []thread.Message{}
	}
	msgs = withBranches(msgs, t.branches(msgs))
	p := HydratePage{Cursor: cursor}
	var merr, ierr error
	p.Messages, merr = json.Marshal(msgs)
	p.Interrupts, ierr = json.Marshal(t.Transcript.Interrupts)
	if merr != nil || ierr != nil {
		return HydratePage{Messages: json.RawMessage("[]"), Interrupts: json.RawMessage("null")}, errors.Join(err, merr, ierr)
	}
	return p, err
}

// EarlierRuns returns the runs accepted before runID that t holds as running, oldest first:
// once their logs end with their terminals, their replies belong in runID's agent's context
// (AgentMessages), though their finishes may not have reached the thread yet.
func (t *Thread) EarlierRuns(runID string) []string {
	var earlier []string
	for _, r := range t.Runs {
		if r.RunID == runID {
			break
		}
		if r.State == ThreadRunRunning && t.Transcript.Anchored(r.RunID) {
			earlier = append(earlier, r.RunID)
		}
	}
	return earlier
}

// RunEvents is an earlier run of a thread (Thread.EarlierRuns) and its log's events, its
// terminal the last.
type RunEvents struct {
	RunID  string
	Events []json.RawMessage
}

// Window is what a run's agent is given of its thread, and what was left out
// (thread.Window).
type Window = thread.Window

// AgentMessages returns the messages runID's agent is given (docs/THREADS.md section 5): t's
// transcript (as the run's acceptance wrote it) with the replies of the earlier runs applied,
// after as many of its sealed messages as budget takes, converted for the agent, merged by id
// with posted (what the run posted) and cut to budget bytes (<= 0: no cut), and the window
// kept. The earlier runs are applied without merging their messages' metadata, which the
// agent does not read. What fails (an earlier run that does not apply, sealed messages that
// cannot be read) is left out and said in the error; the rest is returned all the same.
func (s *Store) AgentMessages(ctx context.Context, t *Thread, runID string, earlier []RunEvents, posted []protocol.Message, budget int) ([]protocol.Message, Window, error) {
	tr := t.Transcript
	var errs []error
	if len(earlier) > 0 {
		tr = tr.Clone()
		for _, r := range earlier {
			if err := tr.FinishContext(r.RunID, r.Events); err != nil {
				errs = append(errs, fmt.Errorf("applying the earlier run %s: %w", r.RunID, err))
			}
		}
	}
	msgs, err := s.sealedAgentMessages(ctx, t, budget)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading the thread's older messages: %w", err))
	}
	msgs = append(msgs, thread.AgentMessages(tr.Context(runID))...)
	input, w := thread.AgentInput(msgs, posted, budget)
	return input, w, errors.Join(errs...)
}
