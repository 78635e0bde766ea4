package thread

import "encoding/json"

// builder is the StreamProcessor of @tanstack/ai 0.58.0, ported.
type builder struct {
	runID string
	msgs  []Message
}

func newBuilder(runID string, settled []Message) *builder {
	return &builder{runID: runID, msgs: append([]Message(nil), settled...)}
}

func (b *builder) apply(raw json.RawMessage) error {
	var e struct {
		Type      string `json:"type"`
		MessageID string `json:"messageId"`
		Delta     string `json:"delta"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return err
	}
	switch e.Type {
	case "TEXT_MESSAGE_START":
		b.msgs = append(b.msgs, Message{ID: e.MessageID, Role: "assistant", Parts: []Part{}})
	case "TEXT_MESSAGE_CONTENT":
		for i := len(b.msgs) - 1; i >= 0; i-- {
			if b.msgs[i].ID == e.MessageID {
				m := &b.msgs[i]
				if n := len(m.Parts); n > 0 && m.Parts[n-1].Type == "text" {
					s := *m.Parts[n-1].Content + e.Delta
					m.Parts[n-1].Content = &s
				} else {
					s := e.Delta
					m.Parts = append(m.Parts, Part{Type: "text", Content: &s})
				}
				break
			}
		}
	}
	return nil
}

func (b *builder) finalize() {}
