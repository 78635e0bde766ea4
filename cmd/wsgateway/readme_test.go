package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeFlagsTable keeps the flags table of docs/CONFIGURATION.md equal to the command
// line: every flag with its environment variable and default, and no row for a flag that
// does not exist.
func TestReadmeFlagsTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "CONFIGURATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `--([a-z-]+)` \\| `([A-Z_]+)` \\|([^|]*)\\|")
	rows := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			rows[m[1]] = m[2:]
		}
	}
	known := map[string]bool{}
	for _, f := range serveFlags {
		known[f.name] = true
		r, ok := rows[f.name]
		if !ok {
			t.Errorf("docs/CONFIGURATION.md flags table has no row for --%s", f.name)
			continue
		}
		if r[0] != f.env() {
			t.Errorf("docs/CONFIGURATION.md: --%s has environment %s, want %s", f.name, r[0], f.env())
		}
		def := strings.TrimSpace(r[1])
		if f.def != "" && def != "`"+f.def+"`" {
			t.Errorf("docs/CONFIGURATION.md: --%s has default %s, want `%s`", f.name, def, f.def)
		}
		if f.def == "" && strings.Contains(def, "`") {
			t.Errorf("docs/CONFIGURATION.md: --%s has default %s, want none", f.name, def)
		}
	}
	for name := range rows {
		if !known[name] {
			t.Errorf("docs/CONFIGURATION.md flags table lists --%s, which wsgateway serve does not have", name)
		}
	}
}
