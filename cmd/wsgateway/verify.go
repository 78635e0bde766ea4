package main

import (
	"fmt"
	"io"
)

// runVerify checks an AG-UI event log (PROTOCOL.md section 4).
func runVerify(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "verify: not implemented yet")
	return 2
}
