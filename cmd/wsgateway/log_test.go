package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	tests := []struct {
		format, level string
		json          bool // the line is a JSON object
		debugShown    bool
	}{
		{"json", "info", true, false},
		{"json", "debug", true, true},
		{"auto", "info", true, false}, // not a terminal: json
		{"text", "debug", false, true},
		{"text", "warn", false, false},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		log, err := newLogger(tt.format, tt.level, &buf)
		if err != nil {
			t.Fatalf("newLogger(%q, %q): %v", tt.format, tt.level, err)
		}
		log.Debug("quiet")
		log.Warn("loud", "key", "value")
		out := buf.String()
		if got := strings.Contains(out, "quiet"); got != tt.debugShown {
			t.Errorf("newLogger(%q, %q): debug line shown = %v, want %v:\n%s", tt.format, tt.level, got, tt.debugShown, out)
		}
		last := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
		var rec map[string]any
		isJSON := json.Unmarshal([]byte(last), &rec) == nil
		if isJSON != tt.json || !strings.Contains(last, "loud") || !strings.Contains(last, "value") {
			t.Errorf("newLogger(%q, %q) wrote %q, want JSON %v", tt.format, tt.level, last, tt.json)
		}
		if strings.Contains(out, "\x1b[") {
			t.Errorf("newLogger(%q, %q) wrote colour codes to a non-terminal: %q", tt.format, tt.level, out)
		}
	}
}

func TestRedactURLs(t *testing.T) {
	got := redactURLs([]string{"nats://user:secret@a:4222", "tls://b:4222"})
	if want := "nats://user:xxxxx@a:4222,tls://b:4222"; got != want {
		t.Errorf("redactURLs = %q, want %q", got, want)
	}
}
