package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// PipelineOptions configures a Pipeline. The zero value checks strict AG-UI 1.0.
type PipelineOptions struct {
	// Upgrade applies the legacy upgrade (THINKING_* and null optionals, as
	// @ag-ui/client's CompatibilityBoundary does) before the schema check.
	Upgrade bool

	// skipSchema lets the conformance vectors that bypass the schema reach
	// expansion and verification.
	skipSchema bool
}

// Pipeline runs the events of one turn through decode, (upgrade,) schema
// check, chunk expansion and verification. It is not safe for concurrent use.
type Pipeline struct {
	opts     PipelineOptions
	up       upgrader
	x        expander
	v        verifier
	failed   bool
	terminal bool
}

// NewPipeline returns a pipeline at the start of a turn.
func NewPipeline(opts PipelineOptions) *Pipeline {
	return &Pipeline{opts: opts}
}

// Push decodes one event (JSON bytes; data is not retained), schema-checks,
// expands and verifies it, and returns the expanded events in order (the
// caller owns the slice; the events are immutable). On error (a *SchemaError, a
// *ViolationError, or ErrNotJSON) it also returns the expanded events that
// were verified before the violation, which a client would already have
// seen; after an error the pipeline refuses further pushes with
// ErrPipelineFailed.
func (p *Pipeline) Push(data []byte) ([]*Event, error) {
	if p.failed {
		return nil, ErrPipelineFailed
	}
	e, err := parseEvent(data)
	if err != nil {
		p.failed = true
		return nil, err
	}
	return p.PushEvent(e)
}

// PushEvent is Push for an event that is already decoded.
func (p *Pipeline) PushEvent(e *Event) ([]*Event, error) {
	if p.failed {
		return nil, ErrPipelineFailed
	}
	if p.opts.Upgrade {
		var err error
		if e, err = p.up.upgrade(e); err != nil {
			p.failed = true
			return nil, err
		}
	}
	if !p.opts.skipSchema {
		var err error
		if e, err = checkEvent(e); err != nil {
			p.failed = true
			return nil, err
		}
	}
	out, err := p.x.push(e, make([]*Event, 0, 2))
	if err != nil {
		p.failed = true
		return nil, err
	}
	for i, ev := range out {
		if err := p.v.push(ev); err != nil {
			p.failed = true
			return out[:i], err
		}
		p.terminal = ev.typ.Terminal()
	}
	return out, nil
}

// Terminated reports whether the last verified event was RUN_FINISHED or RUN_ERROR.
func (p *Pipeline) Terminated() bool { return p.terminal }

// Failed reports whether the pipeline refuses further pushes.
func (p *Pipeline) Failed() bool { return p.failed }

// Fail returns the events that end the turn with RUN_ERROR{message, code}
// (code omitted when ""): when the pipeline has not failed, first the
// synthetic ENDs of open chunk lanes (as a RUN_ERROR passing through chunk
// expansion would produce them) that the verifier accepts, then the RUN_ERROR,
// so that the stored sequence is always one clients accept. The pipeline refuses
// further pushes afterwards. Fail does not judge whether a RUN_ERROR is
// acceptable at this point (after a RUN_ERROR it is not): callers check
// Terminated first.
func (p *Pipeline) Fail(message, code string) []*Event {
	var out []*Event
	if !p.failed {
		for _, e := range p.x.endAll() {
			// An END the verifier refuses (an event of another subagent took the id
			// over since the chunk opened it) would make clients reject the whole
			// log; leaving that entity open is valid, since RUN_ERROR allows it.
			if p.v.push(e) == nil {
				out = append(out, e)
			}
		}
	}
	p.x = expander{}
	p.failed = true
	p.terminal = true
	re, _ := newEvent(AppendRunError(nil, message, code))
	return append(out, re)
}

// LineError is a rejection by VerifyStream at a 1-based input line.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// VerifyStream implements `wsgateway verify`: it reads NDJSON events from r
// (blank lines skipped), writes the expanded events to w as NDJSON, and stops
// at the first violation with a *LineError. Events verified before the
// violation are written. Read and write failures are returned as they are.
func VerifyStream(r io.Reader, w io.Writer, opts PipelineOptions) error {
	p := NewPipeline(opts)
	br := bufio.NewReaderSize(r, 64<<10)
	bw := bufio.NewWriterSize(w, 64<<10)
	line := 0
	for {
		data, rerr := br.ReadBytes('\n')
		if len(data) > 0 {
			line++
			if len(bytes.TrimSpace(data)) > 0 {
				events, err := p.Push(data)
				for _, e := range events {
					bw.Write(e.raw)
					bw.WriteByte('\n')
				}
				if err != nil {
					if ferr := bw.Flush(); ferr != nil {
						return ferr
					}
					return &LineError{Line: line, Err: err}
				}
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return bw.Flush()
			}
			return rerr
		}
	}
}
