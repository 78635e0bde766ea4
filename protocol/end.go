package protocol

// EndKind is how a run ended, as its terminal event says.
type EndKind string

// The ways a run ends.
const (
	EndFinished    EndKind = "finished"    // RUN_FINISHED
	EndInterrupted EndKind = "interrupted" // RUN_FINISHED whose outcome is an interrupt: the run waits for answers
	EndError       EndKind = "error"       // RUN_ERROR
)

// End is how a run ended: the kind of its terminal event and, for a RUN_ERROR, its code.
type End struct {
	Kind EndKind
	Code string // the RUN_ERROR's "code"; "" for RUN_FINISHED, and when absent or not a string
}

// EndOf is the one reading of how a run ended, given its terminal event: RUN_FINISHED is
// EndFinished, or EndInterrupted when its outcome is an object whose "type" is "interrupt";
// RUN_ERROR is EndError with its code. It reports false for any other event and for input
// that is not a JSON object. It reads the members as JSON.parse does (keys exactly, the last
// of duplicates wins) and does not check the event against the schema: the events of a run's
// log were checked when they were appended, and the gateway's own terminals are valid.
func EndOf(event []byte) (End, bool) {
	e, err := parseEvent(event)
	if err != nil {
		return End{}, false
	}
	return e.End()
}

// End reports how a run ended if e is its terminal event, as EndOf does.
func (e *Event) End() (End, bool) {
	switch e.typ {
	case RunFinished:
		if oc := lookup(e.m, "outcome"); isObject(oc) {
			var buf [4]member
			if t := lookup(splitObject(oc, buf[:0]), "type"); isString(t) && unquote(t) == "interrupt" {
				return End{Kind: EndInterrupted}, true
			}
		}
		return End{Kind: EndFinished}, true
	case RunError:
		return End{Kind: EndError, Code: e.Str("code")}, true
	}
	return End{}, false
}
