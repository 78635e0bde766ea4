// Package sse reads server-sent event streams for the agents that speak HTTP upstream
// (agent/aguihttp and agent/openai): one implementation of the parser and of the request's
// limits.
//
// Reader parses the text/event-stream format of the HTML standard: lines end with LF, CRLF or
// CR, a line starting with ':' is a comment, "data" lines of one event are joined with "\n", a
// blank line dispatches the event, an event without data is not dispatched, and an event still
// open at the end of the stream is discarded. Lines may be split across reads in any way. An
// event whose data exceeds the limit fails with ErrTooLarge before it is buffered whole.
//
// Stream posts a request and hands each event of the answer to a callback, bounded by the
// timeouts of Limits: the wait for the first event and the longest silence after it. A
// non-2xx answer is a *StatusError holding the status and a short excerpt of the body.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Errors of the reader. Compare with errors.Is.
var (
	// ErrTooLarge reports an event (or a line) larger than the reader's limit. Its text,
	// like Stream's errors, is meant for the client.
	ErrTooLarge = errors.New("an upstream event is too large")
)

// DefaultMaxEventBytes bounds one event when a limit of 0 is given.
const DefaultMaxEventBytes = 1 << 20

// Event is one dispatched server-sent event.
type Event struct {
	Type string // the "event" field; "" means "message"
	Data string // the "data" lines, joined with "\n"
	ID   string // the last "id" field seen, as the standard keeps it across events
}

// Reader parses events from an io.Reader. It is not safe for concurrent use.
type Reader struct {
	r     *bufio.Reader
	max   int
	data  bytes.Buffer
	typ   string
	id    string
	has   bool // a data field was seen in the current event
	line  []byte
	first bool // the next line is the stream's first (a BOM may precede it)
	cr    bool // the previous line ended with CR: a following LF belongs to it
}

// NewReader returns a Reader of r whose events may hold at most maxEventBytes of data
// (DefaultMaxEventBytes when 0 or less).
func NewReader(r io.Reader, maxEventBytes int) *Reader {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	return &Reader{r: bufio.NewReaderSize(r, 32<<10), max: maxEventBytes, first: true}
}

// Next returns the next event. It returns io.EOF at the end of the stream (an unfinished
// event is dropped), ErrTooLarge for an event over the limit, and the underlying reader's
// error otherwise.
func (r *Reader) Next() (Event, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if ev, ok := r.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			if r.has {
				r.data.WriteByte('\n')
			}
			r.has = true
			if r.data.Len()+len(value) > r.max {
				return Event{}, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, r.max)
			}
			r.data.Write(value)
		case "event":
			r.typ = string(value)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.id = string(value)
			}
		}
		// "retry" and unknown fields are ignored, as the standard says.
	}
}

// dispatch ends the current event and reports whether it is to be delivered.
func (r *Reader) dispatch() (Event, bool) {
	ev := Event{Type: r.typ, Data: r.data.String(), ID: r.id}
	ok := r.has
	r.data.Reset()
	r.typ = ""
	r.has = false
	return ev, ok
}

// readLine returns the next line without its terminator (LF, CRLF or CR). The returned slice
// is valid until the next call.
func (r *Reader) readLine() ([]byte, error) {
	r.line = r.line[:0]
	for {
		b, err := r.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(r.line) > 0 {
				// A last line without terminator is incomplete: its event is never dispatched.
				return nil, io.EOF
			}
			return nil, err
		}
		if r.cr {
			r.cr = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return r.takeLine(), nil
		case '\r':
			r.cr = true
			return r.takeLine(), nil
		}
		if len(r.line) > r.max+len("data: ") {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, r.max)
		}
		r.line = append(r.line, b)
	}
}

func (r *Reader) takeLine() []byte {
	line := r.line
	if r.first {
		r.first = false
		line = bytes.TrimPrefix(line, []byte("\uFEFF"))
	}
	return line
}

// Excerpt returns at most n bytes of b as printable text: valid UTF-8, control characters
// replaced by spaces, runs of white space collapsed, "…" appended when cut.
func Excerpt(b []byte, n int) string {
	cut := false
	if len(b) > n {
		b, cut = b[:n], true
		// Drop a rune cut in the middle rather than show a replacement character.
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.FullRune(b[lastRuneStart(b):]); i++ {
			b = b[:len(b)-1]
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ' ' }), " ")
	if cut {
		s += "…"
	}
	return s
}

// lastRuneStart returns the index where the last (possibly partial) rune of b starts.
func lastRuneStart(b []byte) int {
	i := len(b) - 1
	for i > 0 && i > len(b)-utf8.UTFMax && !utf8.RuneStart(b[i]) {
		i--
	}
	return i
}
