package main

import (
	"errors"
	"fmt"
	"strconv"
)

// Sequence errors found by checker. Compare with errors.Is.
var (
	errGap       = errors.New("wsbench: event out of script (gap or reorder)")
	errDuplicate = errors.New("wsbench: duplicate offset")
	errAfterEnd  = errors.New("wsbench: event after the terminal event")
	errNoOffset  = errors.New("wsbench: envelope without an offset")
)

// acceptedName is the CUSTOM event both servers store first in every run log.
const acceptedName = "run.accepted"

// checker follows one turn's events against the demo agent's script for tokens deltas:
// CUSTOM run.accepted (optional, first), RUN_STARTED, TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT
// "t1 " … "tN ", TEXT_MESSAGE_END, RUN_FINISHED. It is not safe for concurrent use.
type checker struct {
	tokens   int
	pos      int // index of the next expected event of the script
	accepted bool
	done     bool
	last     string // the last offset received
	seen     map[string]struct{}
	events   int
}

func newChecker(tokens int) *checker {
	return &checker{tokens: tokens, seen: make(map[string]struct{}, tokens+8)}
}

// reset prepares c for a new turn, keeping its memory.
func (c *checker) reset(tokens int) {
	c.tokens, c.pos, c.accepted, c.done, c.last, c.events = tokens, 0, false, false, "", 0
	clear(c.seen)
}

// add checks the next envelope: its offset and event. A nil error means the event is the
// next one of the script.
func (c *checker) add(offset string, ev *event) error {
	if offset == "" {
		return errNoOffset
	}
	if _, dup := c.seen[offset]; dup {
		return fmt.Errorf("%w %q (%s)", errDuplicate, offset, ev.Type)
	}
	c.seen[offset] = struct{}{}
	c.last = offset
	c.events++
	if c.done {
		return fmt.Errorf("%w: %s", errAfterEnd, ev.Type)
	}
	if ev.Type == "CUSTOM" && ev.Name == acceptedName && c.pos == 0 && !c.accepted {
		c.accepted = true
		return nil
	}
	want, wantDelta := c.expected(c.pos)
	if ev.Type != want || (wantDelta != "" && ev.Delta != wantDelta) {
		return fmt.Errorf("%w: event %d is %s %q, want %s %q", errGap, c.pos, ev.Type, ev.Delta+ev.Message, want, wantDelta)
	}
	c.pos++
	if want == "RUN_FINISHED" {
		c.done = true
	}
	return nil
}

// expected returns the type (and delta, for content) of the script's event i.
func (c *checker) expected(i int) (typ, delta string) {
	switch {
	case i == 0:
		return "RUN_STARTED", ""
	case i == 1:
		return "TEXT_MESSAGE_START", ""
	case i < c.tokens+2:
		return "TEXT_MESSAGE_CONTENT", "t" + strconv.Itoa(i-1) + " "
	case i == c.tokens+2:
		return "TEXT_MESSAGE_END", ""
	default:
		return "RUN_FINISHED", ""
	}
}

// scriptLen is the number of events a complete turn delivers, run.accepted included.
func scriptLen(tokens int) int { return tokens + 5 }
