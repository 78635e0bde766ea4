package thread_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/wsgateway/wsgateway/thread"
)

// TestEncodingAsEncodingJSON checks that a transcript encodes to the bytes encoding/json
// writes for the same fields (Message and Transcript write their encodings themselves, to
// check and compact once), and that it decodes back to what it was: a thread a gateway of
// either kind stored reads the same, each part in its typed form.
func TestEncodingAsEncodingJSON(t *testing.T) {
	approved := true
	step := ""
	tr := thread.Transcript{
		Messages: []thread.Message{
			{ID: "u1", Role: "user", CreatedAt: "2026-01-02T03:04:05.000Z", Parts: []thread.Part{
				{Type: "text", Content: "a <b> & \"c\" \u2028 é end"},
				{Type: "image", Raw: json.RawMessage(`{"type":"image", "source":{"url":"x"}}`)},
			}},
			{ID: "a1", Role: "assistant", Metadata: json.RawMessage(`{"k": [1, 2]}`), Parts: []thread.Part{
				{Type: "thinking", Content: "hmm", StepID: &step, Signature: "s"},
				{Type: "tool-call", ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`, Input: json.RawMessage(`{"city":"Paris"}`),
					Output: json.RawMessage(`{"temp":20}`), State: "approval-responded", Approval: &thread.Approval{ID: "i1", NeedsApproval: true, Approved: &approved}},
				{Type: "tool-result", ToolCallID: "c1", Content: `{"temp":20}`, State: "complete"},
				{Type: "text", Content: "20 degrees"},
			}},
			{ID: "s1", Role: "system"},
		},
		Interrupts: &thread.Interrupts{RunID: "r1", Pending: []json.RawMessage{json.RawMessage(`{"id":"i2"}`)}},
		Answered:   map[string]*thread.Interrupts{"r0": {RunID: "r0", Pending: []json.RawMessage{json.RawMessage(`{"id":"i1"}`)}}},
	}
	got, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}

	// The same fields through encoding/json alone.
	type plainMessage struct {
		ID        string          `json:"id"`
		Role      string          `json:"role"`
		Parts     []thread.Part   `json:"parts"`
		CreatedAt string          `json:"createdAt,omitempty"`
		Metadata  json.RawMessage `json:"metadata,omitempty"`
	}
	type plainTranscript struct {
		Messages   []plainMessage                `json:"messages"`
		Interrupts *thread.Interrupts            `json:"interrupts,omitempty"`
		Answered   map[string]*thread.Interrupts `json:"answered,omitempty"`
	}
	p := plainTranscript{Interrupts: tr.Interrupts, Answered: tr.Answered}
	for _, m := range tr.Messages {
		parts := m.Parts
		if parts == nil {
			parts = []thread.Part{}
		}
		p.Messages = append(p.Messages, plainMessage{m.ID, m.Role, parts, m.CreatedAt, m.Metadata})
	}
	want, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding\n got %s\nwant %s", got, want)
	}

	var back thread.Transcript
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	again, err := json.Marshal(back)
	if err != nil || !bytes.Equal(again, got) {
		t.Fatalf("after a round trip %s (%v), want %s", again, err, got)
	}
	for i, m := range back.Messages {
		for j, part := range m.Parts {
			if typed := part.Type != "image"; typed != (part.Raw == nil) {
				t.Errorf("message %d part %d (%s): Raw %s, want it kept verbatim only for the image", i, j, part.Type, part.Raw)
			}
		}
	}
	if c := back.Messages[0].Parts[0].Content; c != "a <b> & \"c\" \u2028 é end" {
		t.Errorf("text content %q after a round trip", c)
	}
	if !reflect.DeepEqual(back.Messages[1].Parts[1].Approval, tr.Messages[1].Parts[1].Approval) {
		t.Errorf("approval %+v after a round trip", back.Messages[1].Parts[1].Approval)
	}
}
