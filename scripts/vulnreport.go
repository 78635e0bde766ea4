//go:build ignore

// Vulnreport reads govulncheck's JSON stream (govulncheck -format json) on standard input and
// reports the vulnerabilities that the code calls, each with the release that fixes it. It exits 1
// if there is one, in a module (upgrade it in go.mod) or in the standard library (raise the go
// directive of go.mod, the toolchain that the scripts, the README and the Dockerfile use).
//
//	govulncheck -db file:///path/to/db -format json ./... | go run scripts/vulnreport.go
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

type message struct {
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
		} `json:"trace"`
	} `json:"finding"`
}

func main() {
	dec := json.NewDecoder(os.Stdin)
	called := map[string]string{} // OSV id -> "module@version (fixed in ...)"
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "vulnreport: reading govulncheck's output:", err)
			os.Exit(2)
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 || f.Trace[0].Function == "" {
			continue // not called by the code
		}
		t := f.Trace[0]
		called[f.OSV] = fmt.Sprintf("%s@%s %s (fixed in %s)", t.Module, t.Version, t.Package, f.FixedVersion)
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Printf("%s  %s\n", id, called[id])
	}
	fmt.Printf("vulnreport: %d called vulnerabilities\n", len(called))
	if len(called) > 0 {
		os.Exit(1)
	}
}
