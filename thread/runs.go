package thread

import (
	"encoding/json"
	"strings"
)

// A run's end: RUN_FINISHED with its interrupts and approvals, RUN_ERROR, and the stream's
// finalization.

func (b *builder) runFinished(e *event) {
	if v := e.raw("finishReason"); v != nil {
		b.finishReason = keep(v)
	} else {
		b.finishReason = keep(e.tanstack("finishReason"))
	}
	id, _ := e.str("runId")
	remove(&b.activeRuns, id)
	b.interrupts = nil
	interrupt := false
	if oc := e.raw("outcome"); isObject(oc) {
		o := object(oc)
		if t, _ := asString(o["type"]); t == "interrupt" {
			interrupt = true
			var list []json.RawMessage
			_ = json.Unmarshal(o["interrupts"], &list)
			b.interrupts = list
			b.handleInterrupts(list)
		}
	}
	if len(b.activeRuns) == 0 {
		b.completeAllToolCalls()
		if fr, _ := asString(b.finishReason); fr == "tool_calls" && !interrupt {
			return
		}
		b.isDone = true
		b.finalizeStream()
	}
}

func (b *builder) handleInterrupts(list []json.RawMessage) {
	for _, raw := range list {
		in := object(raw)
		if in == nil {
			continue
		}
		callID, _ := asString(in["toolCallId"])
		if callID == "" {
			continue
		}
		md := object(in["metadata"])
		kind, _ := asString(md["kind"])
		reason, _ := asString(in["reason"])
		if kind != "approval" && reason != "approval_required" {
			continue
		}
		target := b.activeAssistantID()
		if !target.ok {
			if id, ok := b.toolCallToMessage[callID]; ok {
				target = some(id)
			} else {
				target = b.messageWithCall(callID, "assistant")
			}
		}
		if target.truthy() {
			id, _ := asString(in["id"])
			b.updateToolCallApproval(target.s, callID, id)
		}
	}
}

func (b *builder) updateToolCallApproval(id, callID, approvalID string) {
	b.each(id, func(m *Message) {
		for i := range m.Parts {
			if p := &m.Parts[i]; p.Type == "tool-call" && p.ID == callID {
				p.State, p.Raw = "approval-requested", nil
				p.Approval = &Approval{ID: approvalID, NeedsApproval: true}
				return
			}
		}
	})
}

func (b *builder) runError(e *event) {
	b.hasError = true
	id, _ := e.str("runId")
	if id == "" {
		if t, ok := asString(e.tanstack("runId")); ok {
			id = t
		}
	}
	if id != "" {
		remove(&b.activeRuns, id)
	} else {
		b.activeRuns = nil
	}
	b.ensureAssistantMessage(opt{})
}

// finalizeStream completes what is open, and drops a last assistant message
// whose parts are all whitespace text.
func (b *builder) finalizeStream() {
	b.isDone = true
	var last opt
	for _, id := range append([]string(nil), b.activeMessageIDs...) {
		st := b.state(id)
		if st == nil {
			continue
		}
		b.completeAllToolCallsForMessage(id)
		if st.pending() {
			b.emitTextUpdate(id)
		}
		st.isComplete = true
		if m := b.find(id); m != nil && m.Role == "assistant" {
			last = some(id)
		}
	}
	b.activeMessageIDs = nil
	if last.ok && !b.hasError {
		if m := b.find(last.s); m != nil && whitespaceOnly(*m) {
			kept := b.msgs[:0]
			for _, m := range b.msgs {
				if m.ID != last.s {
					kept = append(kept, m)
				}
			}
			b.msgs = kept
		}
	}
}

func whitespaceOnly(m Message) bool {
	if len(m.Parts) == 0 {
		return false
	}
	for _, p := range m.Parts {
		if p.Type != "text" || strings.TrimFunc(p.text(), jsSpace) != "" {
			return false
		}
	}
	return true
}

// jsSpace is JavaScript's WhiteSpace and LineTerminator (String.prototype.trim).
func jsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}
