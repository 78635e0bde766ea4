package jetstream

import (
	"testing"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TestReapEndsWithTerminal checks which last batches of a log the reaper closes without a
// terminal of its own.
func TestReapEndsWithTerminal(t *testing.T) {
	batch := func(events ...string) *natsjs.RawStreamMsg {
		evs := make([][]byte, len(events))
		for i, e := range events {
			evs[i] = []byte(e)
		}
		return &natsjs.RawStreamMsg{Header: nats.Header{}, Data: encodeBatch(nil, evs)}
	}
	closeRecord := &natsjs.RawStreamMsg{Header: nats.Header{hdrCtl: {ctlClose}}}
	for _, tc := range []struct {
		name string
		m    *natsjs.RawStreamMsg
		want bool
	}{
		{"RUN_FINISHED", batch(`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`, `{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`), true},
		{"RUN_ERROR", batch(`{"type":"RUN_ERROR","message":"boom","code":"agent_error"}`), true},
		{"the reaper's terminal", batch(string(ProducerLost)), true},
		{"a terminal before the last event", batch(`{"type":"RUN_ERROR","message":"boom"}`, `{"type":"TEXT_MESSAGE_END","messageId":"m1"}`), false},
		{"the marker", batch(`{"type":"CUSTOM","name":"run.accepted","value":{}}`), false},
		{"an undecodable event", batch(`{"type":"RUN_FINISHED"`), false},
		{"an empty batch", batch(), false},
		{"a close record", closeRecord, false},
	} {
		if got := endsWithTerminal(tc.m); got != tc.want {
			t.Errorf("%s: endsWithTerminal = %v, want %v", tc.name, got, tc.want)
		}
	}
}
