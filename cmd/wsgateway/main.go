// Command wsgateway runs the WebSocket gateway and its tools.
//
//	wsgateway [serve] [flags]   run the gateway (the default)
//	wsgateway verify [FILE]     check an AG-UI event log (NDJSON)
//	wsgateway version           print the version
package main

import (
	"fmt"
	"io"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return runServe(args, stdout, stderr)
	case "verify":
		return runVerify(args, stdin, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "wsgateway", version)
		return 0
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "wsgateway: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}

const usage = `Usage:
  wsgateway [serve] [flags]   run the gateway (see 'wsgateway serve --help')
  wsgateway verify [FILE]     check an AG-UI event log (NDJSON); see 'wsgateway verify --help'
  wsgateway version           print the version
`
