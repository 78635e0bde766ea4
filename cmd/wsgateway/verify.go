package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/wsgateway/wsgateway/protocol"
)

const verifyUsage = `Usage: wsgateway verify [--upgrade] [FILE]

Checks an AG-UI event log: NDJSON, one event per line (blank lines are
skipped), read from FILE or standard input. Each event is schema-checked
against AG-UI 1.0, its chunks are expanded (TEXT_MESSAGE_CHUNK,
TOOL_CALL_CHUNK, REASONING_MESSAGE_CHUNK into start/content/end) and the
sequence is verified, as @ag-ui/client 1.0.0 does. The expanded events are
written to standard output as NDJSON.

Exit status: 0 when the sequence is accepted; 1 at the first violation,
reported on standard error as "verify: line N: <message>"; 2 for usage or
I/O errors.

Flags:
`

// runVerify checks an AG-UI event log (PROTOCOL.md section 4).
func runVerify(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	upgrade := fs.Bool("upgrade", false, "upgrade legacy events (THINKING_*, null optionals) before the schema check")
	usage := func(w io.Writer) {
		fmt.Fprint(w, verifyUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	fs.Usage = func() {} // printed below, to stdout for --help
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return 0
		}
		usage(stderr)
		return 2
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "verify: at most one FILE, got %d\n", fs.NArg())
		usage(stderr)
		return 2
	}
	in := stdin
	if fs.NArg() == 1 && fs.Arg(0) != "-" {
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			fmt.Fprintf(stderr, "verify: %v\n", err)
			return 2
		}
		defer f.Close()
		in = f
	}
	err := protocol.VerifyStream(in, stdout, protocol.PipelineOptions{Upgrade: *upgrade})
	var le *protocol.LineError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &le):
		fmt.Fprintf(stderr, "verify: line %d: %v\n", le.Line, le.Err)
		return 1
	default:
		fmt.Fprintf(stderr, "verify: %v\n", err)
		return 2
	}
}
