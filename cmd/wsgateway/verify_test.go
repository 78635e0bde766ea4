package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVerify(t *testing.T) {
	const (
		rs = `{"type":"RUN_STARTED","threadId":"t","runId":"r"}`
		rf = `{"type":"RUN_FINISHED","threadId":"t","runId":"r"}`
	)
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string // exact when wantCode is 1, a prefix otherwise
	}{
		{
			name:       "chunks expanded",
			stdin:      rs + "\n\n" + `{"type":"TEXT_MESSAGE_CHUNK", "messageId":"m1","delta":"Hi"}` + "\n" + rf + "\n",
			wantStdout: rs + "\n" + `{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}` + "\n" + `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hi"}` + "\n" + `{"type":"TEXT_MESSAGE_END","messageId":"m1"}` + "\n" + rf + "\n",
		},
		{
			name:       "no trailing newline, CRLF",
			stdin:      rs + "\r\n" + rf,
			wantStdout: rs + "\n" + rf + "\n",
		},
		{
			name:       "empty input",
			stdin:      "",
			wantStdout: "",
		},
		{
			name:       "violation reports the line",
			stdin:      rs + "\n\n" + `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}` + "\n" + rf + "\n",
			wantCode:   1,
			wantStdout: rs + "\n",
			wantStderr: "verify: line 3: Cannot send 'TEXT_MESSAGE_CONTENT' event: No active text message found with ID 'm1'. Start a text message with 'TEXT_MESSAGE_START' first.\n",
		},
		{
			name:       "schema rejection names the path",
			stdin:      `{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"tool"}` + "\n",
			wantCode:   1,
			wantStderr: `verify: line 1: role: Invalid option: expected one of "developer"|"system"|"assistant"|"user"` + "\n",
		},
		{
			name:       "legacy refused without --upgrade",
			stdin:      rs + "\n" + `{"type":"THINKING_START"}` + "\n",
			wantCode:   1,
			wantStdout: rs + "\n",
			wantStderr: "verify: line 2: type: Invalid input\n",
		},
		{
			name:       "legacy nulls upgraded",
			args:       []string{"--upgrade"},
			stdin:      rs + "\n" + `{"type":"RUN_FINISHED","threadId":"t","runId":"r","outcome":null,"result":null}` + "\n",
			wantStdout: rs + "\n" + rf + "\n",
		},
		{
			name:       "not JSON",
			stdin:      rs + "\n{nope\n",
			wantCode:   1,
			wantStdout: rs + "\n",
			wantStderr: "verify: line 2: protocol: not JSON: invalid character 'n' looking for beginning of object key string\n",
		},
		{
			name:       "missing file",
			args:       []string{filepath.Join(t.TempDir(), "absent.ndjson")},
			wantCode:   2,
			wantStderr: "verify: open ",
		},
		{
			name:       "two files",
			args:       []string{"a", "b"},
			wantCode:   2,
			wantStderr: "verify: at most one FILE, got 2\n",
		},
		{
			name:       "unknown flag",
			args:       []string{"--nope"},
			wantCode:   2,
			wantStderr: "flag provided but not defined: -nope\n",
		},
		{
			name:       "help",
			args:       []string{"--help"},
			wantStdout: "Usage: wsgateway verify [--upgrade] [FILE]\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"verify"}, tt.args...), strings.NewReader(tt.stdin), &stdout, &stderr)
			if code != tt.wantCode {
				t.Fatalf("exit code %d, want %d; stderr %q", code, tt.wantCode, stderr.String())
			}
			if tt.name == "help" {
				if !strings.HasPrefix(stdout.String(), tt.wantStdout) || !strings.Contains(stdout.String(), "-upgrade") || stderr.Len() != 0 {
					t.Fatalf("help: stdout %q stderr %q", stdout.String(), stderr.String())
				}
				return
			}
			if got := stdout.String(); got != tt.wantStdout {
				t.Errorf("stdout\n%s\nwant\n%s", got, tt.wantStdout)
			}
			switch {
			case tt.wantCode == 1 && stderr.String() != tt.wantStderr:
				t.Errorf("stderr %q, want %q", stderr.String(), tt.wantStderr)
			case !strings.HasPrefix(stderr.String(), tt.wantStderr):
				t.Errorf("stderr %q, want prefix %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestVerifyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.ndjson")
	log := `{"type":"RUN_STARTED","threadId":"t","runId":"r"}
{"type":"TOOL_CALL_CHUNK","toolCallId":"c1","toolCallName":"f","delta":"{}","subagentRunId":"s1"}
{"type":"RUN_FINISHED","threadId":"t","runId":"r"}
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"verify", path}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("verify %s: exit %d, stderr %q", path, code, stderr.String())
	}
	want := `{"type":"RUN_STARTED","threadId":"t","runId":"r"}
{"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"f","subagentRunId":"s1"}
{"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{}","subagentRunId":"s1"}
{"type":"TOOL_CALL_END","toolCallId":"c1","subagentRunId":"s1"}
{"type":"RUN_FINISHED","threadId":"t","runId":"r"}
`
	if stdout.String() != want {
		t.Fatalf("stdout\n%s\nwant\n%s", stdout.String(), want)
	}
}
