package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemoOutcomes runs the demo agent's options through a real gateway and checks how each
// turn's log ends, as a client joining it sees it.
func TestDemoOutcomes(t *testing.T) {
	gw := startGateway(t)
	tests := []struct {
		name      string
		opts      string
		wantTypes string // the log's event types, in order
		wantCode  string // RUN_ERROR code of the last event; "" for RUN_FINISHED
		wantMsg   string // in the RUN_ERROR message
	}{
		{"reply", `{"tokens":2,"intervalMs":0}`,
			"CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED", "", ""},
		{"chunked, expanded by the gateway", `{"tokens":2,"chunked":true,"intervalMs":0}`,
			"CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED", "", ""},
		{"agent loop", `{"tokens":1,"runs":2,"intervalMs":0}`,
			"CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED", "", ""},
		{"fail at start", `{"fail":"start"}`, "CUSTOM RUN_ERROR", "agent_error", "injected failure"},
		{"fail midway", `{"fail":"middle","tokens":4,"intervalMs":0}`,
			"CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR", "agent_error", "injected failure"},
		{"invalid", `{"invalid":true,"tokens":4,"intervalMs":0}`,
			"CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT RUN_ERROR", "protocol_violation", "No active text message found"},
		{"bad option", `{"tokens":-1}`, "CUSTOM RUN_ERROR", "agent_error", "tokens -1 out of 0..1000000"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			runID := "run-outcome-" + string(rune('a'+i))
			c := dialTurn(t, ctx, gw, runID, tt.opts)
			// The first envelope (run.accepted) says the log exists; a join sent before it
			// could outlast the gateway's first-event deadline on a loaded machine.
			if _, _, err := c.Read(ctx); err != nil {
				t.Fatal(err)
			}
			log := joinLog(t, ctx, gw, runID)
			if got := eventTypes(log); got != tt.wantTypes {
				t.Errorf("log of %s = %s, want %s", tt.opts, got, tt.wantTypes)
			}
			last := log[len(log)-1]
			if tt.wantCode == "" {
				return
			}
			msg, _ := last["message"].(string)
			if last["code"] != tt.wantCode || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("last event of %s = %v, want RUN_ERROR code %s with %q", tt.opts, last, tt.wantCode, tt.wantMsg)
			}
		})
	}
}
