package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// Store is the run log store, as sockets and HTTP streams use it: RunStore of a
// *jetstream.Store, or a test's own. Its errors match ErrForbidden, ErrUnknownRun and
// ErrInvalidOffset with errors.Is.
type Store interface {
	// Create starts (or, for the same principal, restarts) the log of runID. A non-nil
	// input (the run's RunAgentInput) is kept with the log, for another gateway to take the
	// run over when this one dies (OnTakeover, Config.Replay).
	Create(ctx context.Context, principal, runID, threadID string, input []byte) (RunLog, error)
	// Read opens runID's log strictly after the offset after (a minted offset, FromStart or
	// FromNow).
	Read(ctx context.Context, principal, runID, after string) (LogReader, error)
	// LastEvent waits until runID's log is closed and returns its last event (nil: none),
	// reading what is stored from now on and one batch, not the whole log.
	LastEvent(ctx context.Context, principal, runID string) ([]byte, error)
	// Snapshot returns what runID's log holds now, and whether it is closed.
	Snapshot(ctx context.Context, principal, runID string) ([]Entry, bool, error)
	// Ended reports whether runID's log holds its terminal (or is closed), without waiting.
	Ended(ctx context.Context, principal, runID string) (bool, error)
	// RequestAbort asks every gateway sharing the store to abort the principal's run;
	// OnAbort delivers those requests (this gateway's own too) for the Server's lifetime.
	RequestAbort(principal, runID, origin string) error
	OnAbort(f func(principal, runID, origin string, interrupt bool)) error
	// RequestInterrupt asks the same of a run that a newer run of its thread interrupts
	// (multitaskStrategy interrupt): it ends RUN_ERROR code interrupted.
	RequestInterrupt(principal, runID string) error
	// OnTakeover hands this gateway the runs created with their input whose producer died
	// (Config.Replay).
	OnTakeover(f func(Takeover) bool)
	// ThreadKey names a principal's thread on the wire. Announce tells every gateway that a
	// run of a thread was accepted, SubscribeThread receives those announcements, and
	// QueryThread asks every gateway which runs of a thread run now, which OnThreadQuery
	// answers (the Server's registry).
	ThreadKey(principal, threadID string) string
	Announce(key string, run Announcement) error
	SubscribeThread(key string, f func(Announcement)) (unsubscribe func(), err error)
	QueryThread(key string, wait time.Duration, f func([]Announcement)) (stop func(), err error)
	OnThreadQuery(running func(key string) []Announcement) error
}

// RunLog is a run's log as its turn writes it.
type RunLog interface {
	turn.Log
	// WaitRoom waits until the log's backlog has room for one more event.
	WaitRoom(ctx context.Context) error
	// Err returns why the log failed (its lease lost, fenced, closed), nil while it works.
	Err() error
	// Info returns the run as the log's creation recorded it.
	Info() RunInfo
}

// LogReader reads a run's log in order.
type LogReader interface {
	// Next returns the next stored entry, blocking while the log is open and idle; io.EOF
	// once the log is closed and read to its end.
	Next(ctx context.Context) (Entry, error)
	// After returns the offset the reader reads strictly after.
	After() string
	// TraceContext returns the span context of the run's turn (invalid: not traced).
	TraceContext() trace.SpanContext
	Close() error
}

// Entry is one stored event of a run's log and its offset.
type Entry struct {
	Offset string
	Event  []byte
}

// Offsets that Read accepts besides minted ones: before the first event, and the log's end
// as it is when the reader opens.
const (
	FromStart = "-1"
	FromNow   = "now"
)

// RunInfo is a run as the creation of its log recorded it.
type RunInfo struct {
	Principal, RunID string
	// Generation counts the creations of the run's log (a resubmit starts a new one).
	Generation uint64
	// Takeovers counts the times a gateway took the run over from one that died.
	Takeovers int
	// TraceParent and TraceState are the W3C trace context of the run's turn, empty when
	// it was not traced.
	TraceParent, TraceState string
}

// Takeover is a run whose producer died, handed to this gateway (Store.OnTakeover): its log
// goes on after Stored through Log.
type Takeover struct {
	Info   RunInfo
	Input  []byte  // what Create kept
	Stored []Entry // the events the log holds, in order
	Log    RunLog
}

// Announcement is a run of a thread accepted by some gateway (Store.Announce): Origin names
// the socket that sent it, Branch is set when its acceptance kept what it replaced as a
// branch.
type Announcement struct {
	RunID, Origin, Branch string
}

// Errors of a Store, matched with errors.Is.
var (
	// ErrForbidden refuses a run that is another principal's.
	ErrForbidden = errors.New("conversation: the run is another principal's")
	// ErrUnknownRun reports a run that does not exist (never created, or aged out).
	ErrUnknownRun = errors.New("conversation: unknown run")
	// ErrInvalidOffset refuses an offset that is not one of the run's (malformed, of
	// another run or generation, or past the log's end).
	ErrInvalidOffset = errors.New("conversation: invalid offset")
)

// eventsOf returns the events of entries.
func eventsOf(entries []Entry) []json.RawMessage {
	events := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		events[i] = e.Event
	}
	return events
}

// logEnded reports whether a run's log, as a Snapshot read it, holds the run's end: it is
// closed, or its last event is a terminal (stored before the close that follows it).
func logEnded(entries []Entry, closed bool) bool {
	if closed || len(entries) == 0 {
		return closed
	}
	_, ended := protocol.EndOf(entries[len(entries)-1].Event)
	return ended
}
