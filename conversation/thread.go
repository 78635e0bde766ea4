package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/wsgateway/wsgateway/protocol"
)

// Threads keeps the principals' threads (docs/THREADS.md sections 1 and 4): ThreadStore of a
// *threadstore.Store, or a test's own. Its errors match ErrUnknownThread, ErrThreadLimit and
// ErrUnknownMessage with errors.Is, and *BusyError with errors.As.
type Threads interface {
	// ReadThreadAhead starts reading a thread for the AcceptRun that follows; AcceptRun
	// records a newly accepted run in its thread and merges its input.
	ReadThreadAhead(ctx context.Context, principal, threadID string) ThreadAhead
	// AcceptRun returns the thread as it wrote it, which the caller does not modify. ahead
	// is nil or what ReadThreadAhead returned for the thread. While an earlier run of the
	// thread is active, a run is accepted beside it, refused (*BusyError) or queued, as the
	// Overlap says.
	AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, ahead ThreadAhead, o Overlap) (Thread, error)
	// FinishRun applies a run's stored events to its thread and records how it ended.
	FinishRun(ctx context.Context, principal, threadID, runID string, events []json.RawMessage) error
	// Thread returns the principal's thread; Threads lists them, newest first;
	// DeleteThread removes one with its runs' logs.
	Thread(ctx context.Context, principal, threadID string) (Thread, error)
	Threads(ctx context.Context, principal string) ([]ThreadSummary, error)
	DeleteThread(ctx context.Context, principal, threadID string) error
	// SwitchBranch makes the branch holding a message the thread's active one
	// (docs/THREADS.md section 7).
	SwitchBranch(ctx context.Context, principal, threadID, messageID string) (Thread, error)
	// Hydrate answers a page of a thread's messages (t nil: a thread without any) with its
	// active run's events so far, reading the records it reaches; AgentMessages returns what
	// a run's agent is given of its thread (docs/THREADS.md section 5), merged with what the
	// run posted. t is a Thread this Threads returned.
	Hydrate(ctx context.Context, t Thread, activeRun string, active []json.RawMessage, limit int, before string) (HydratePage, error)
	AgentMessages(ctx context.Context, t Thread, runID string, earlier []RunEvents, posted []protocol.Message, budget int) ([]protocol.Message, Window, error)
}

// Thread is a thread as its store read or wrote it: its runs, in order of acceptance.
type Thread interface {
	// Runs returns the thread's runs and their states.
	Runs() []ThreadRun
	// ActiveRun returns the newest run still running, "" when none.
	ActiveRun() string
	// RunState returns the state of the run runID, "" when the thread does not hold it.
	RunState(runID string) string
	// Ahead returns how many runs accepted before runID have not ended (queued or running).
	Ahead(runID string) int
	// EarlierRuns returns the runs accepted before runID that the thread holds as running
	// and whose replies belong in runID's agent's context once their logs end with their
	// terminals, oldest first.
	EarlierRuns(runID string) []string
}

// ThreadRun is a run of a thread and its state (ThreadRunQueued, ThreadRunRunning, or one
// of the ended states of docs/THREADS.md).
type ThreadRun struct {
	RunID, State string
}

// States of a thread's run that the conversation acts on.
const (
	ThreadRunQueued  = "queued"  // accepted behind earlier runs, not started
	ThreadRunRunning = "running" // accepted, no terminal stored yet
)

// ThreadAhead is a thread read ahead of its update (Threads.ReadThreadAhead).
type ThreadAhead interface {
	// BusyWith waits for the read and returns the newest run of the thread as read,
	// accepted before runID, that is still active (queued, or running and not ended), ""
	// when none.
	BusyWith(ctx context.Context, principal, threadID, runID string, ended Ended) (string, error)
}

// Ended reports whether a run of the principal has stored its terminal: a thread shows its
// runs running until their finish lands, a moment after.
type Ended func(ctx context.Context, runID string) (bool, error)

// Overlap is what AcceptRun does with a run while a run of its thread accepted before it is
// active (docs/THREADS.md section 6). The zero Overlap accepts it beside that run
// (concurrent).
type Overlap struct {
	// Ended, if set, tells running runs that stored their terminal from the others: the
	// run is accepted only once no earlier run is active, else refused with a *BusyError
	// (reject), or with Queue recorded queued (enqueue), to start once no earlier run is
	// active. Rollback, with Queue, takes the runs running when the run is queued out of
	// the transcript (rollback).
	Ended           Ended
	Queue, Rollback bool
}

// ThreadSummary is a thread as a list shows it.
type ThreadSummary struct {
	ThreadID, Title  string
	Created, Updated time.Time
	ActiveRun        string // "" when none
}

// HydratePage is a page of a thread as a hydrate answers it (docs/THREADS.md section 1), in
// the JSON of the answer.
type HydratePage struct {
	Messages   json.RawMessage // the page's messages, oldest first: a JSON array
	Interrupts json.RawMessage // the thread's pending interrupts: a JSON object, or null
	Cursor     string          // the page before this one ("" at the thread's start, or with no limit)
}

// RunEvents is an earlier run of a thread (Thread.EarlierRuns) and its log's events, its
// terminal the last.
type RunEvents struct {
	RunID  string
	Events []json.RawMessage
}

// Window is what a run's agent is given of its thread, and what was left out.
type Window struct {
	Messages, Bytes       int // the messages given to the agent, and their bytes of JSON
	Dropped, DroppedBytes int // the messages left out, and their bytes
}

// Errors of a Threads, matched with errors.Is.
var (
	// ErrUnknownThread reports a thread the principal does not have.
	ErrUnknownThread = errors.New("conversation: unknown thread")
	// ErrThreadLimit refuses a run that would start a thread beyond the principal's.
	ErrThreadLimit = errors.New("conversation: the principal has as many threads as it may")
	// ErrUnknownMessage reports a message the thread does not hold.
	ErrUnknownMessage = errors.New("conversation: unknown message")
)

// BusyError refuses a run, or a switch of branch, while a run of the thread is active.
type BusyError struct{ ActiveRun string }

func (e *BusyError) Error() string {
	return "conversation: the thread has a run in progress: " + e.ActiveRun
}
