package protocol_test

import (
	"testing"

	"github.com/wsgateway/wsgateway/protocol"
)

// TestWithMessages: an input's messages are replaced in its fields and in its JSON (which an
// AG-UI agent forwards), its other members kept as they were.
func TestWithMessages(t *testing.T) {
	in, err := protocol.DecodeRunAgentInput([]byte(`{"threadId":"T","runId":"r2","messages":[{"id":"u2","role":"user","content":"two"}],` +
		`"forwardedProps":{"x":1},"custom":true}`))
	if err != nil {
		t.Fatal(err)
	}
	thread, err := protocol.DecodeRunAgentInput([]byte(`{"threadId":"T","runId":"r","messages":[{"id":"u1","role":"user","content":"one"},` +
		`{"id":"a1","role":"assistant","content":"reply"},{"id":"u2","role":"user","content":"two"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := in.WithMessages(thread.Messages)
	const want = `{"threadId":"T","runId":"r2","messages":[{"id":"u1","role":"user","content":"one"},{"id":"a1","role":"assistant","content":"reply"},` +
		`{"id":"u2","role":"user","content":"two"}],"forwardedProps":{"x":1},"custom":true,"tools":[],"context":[]}`
	if string(got.JSON()) != want {
		t.Fatalf("JSON() = %s\nwant %s", got.JSON(), want)
	}
	again, err := protocol.DecodeRunAgentInput(got.JSON())
	if err != nil || len(again.Messages) != 3 || len(got.Messages) != 3 || got.Messages[1].ID != "a1" || got.RunID != "r2" {
		t.Fatalf("WithMessages gave %d messages (%v), decoding its JSON %v", len(got.Messages), got.Messages, err)
	}
	if len(in.Messages) != 1 || string(in.JSON()) == want {
		t.Fatal("WithMessages changed the input it copies")
	}
}
