//go:build ignore

// Vulnreport reads govulncheck's JSON stream (govulncheck -format json) on standard input and
// reports the vulnerabilities that the code calls. It exits 1 if one of them is in a module
// (the project can upgrade it); those of the standard library are printed with the Go
// release that fixes them but do not fail, since the toolchain is the machine's.
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
	modules := map[string]bool{}  // OSV ids in modules other than the standard library
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
		if t.Module != "stdlib" {
			modules[f.OSV] = true
		}
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		kind := "standard library (toolchain)"
		if modules[id] {
			kind = "MODULE"
		}
		fmt.Printf("%s  %s  %s\n", id, kind, called[id])
	}
	fmt.Printf("vulnreport: %d called vulnerabilities: %d in modules, %d in the standard library of the toolchain\n",
		len(called), len(modules), len(called)-len(modules))
	if len(modules) > 0 {
		os.Exit(1)
	}
}
