package thread

import (
	"encoding/json"
)

// The builder's steps and reasoning: STEP_STARTED and STEP_FINISHED, reasoning content and
// its signatures, thinking parts.

func (b *builder) stepStarted(e *event) {
	step, _ := e.str("stepName")
	if step == "" {
		step = b.mint("s")
	}
	if active := b.activeAssistantID(); active.truthy() {
		if st := b.state(active.s); st != nil {
			st.currentThinkingStepID = some(step)
			st.addStep(step, "")
			b.pendingThinkingID = ""
			return
		}
	}
	b.pendingThinkingID = step
}

func (b *builder) stepFinished(e *event) {
	sig, _ := e.str("signature")
	if sig == "" {
		return
	}
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	step := st.currentThinkingStepID
	if !step.ok {
		step.s, step.ok = e.str("stepId")
	}
	if !step.truthy() {
		return
	}
	thinking, ok := st.thinkingSteps[step.s]
	if !ok {
		return
	}
	st.thinkingStepSignatures[step.s] = sig
	b.updateThinkingPart(id, step.s, thinking, sig)
}

func (b *builder) reasoningContent(e *event) {
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	delta, _ := e.str("delta")
	if b.pendingThinkingID != "" {
		st.currentThinkingStepID = some(b.pendingThinkingID)
		st.addStep(b.pendingThinkingID, "")
		b.pendingThinkingID = ""
	}
	step := st.currentThinkingStepID.s
	if !st.currentThinkingStepID.ok {
		step, _ = e.str("messageId")
	}
	if _, ok := st.thinkingSteps[step]; !ok {
		st.thinkingSteps[step] = ""
		st.currentThinkingStepID = some(step)
	}
	st.thinkingSteps[step] += delta
	b.updateThinkingPart(id, step, st.thinkingSteps[step], st.thinkingStepSignatures[step])
}

func (b *builder) encryptedValue(e *event) {
	value, _ := e.str("encryptedValue")
	if value == "" {
		return
	}
	entity, _ := e.str("entityId")
	if sub, _ := e.str("subtype"); sub == "tool-call" {
		b.attachToolCallSignature(entity, value)
		return
	}
	id, st := b.ensureAssistantMessage(b.activeAssistantID())
	step := st.currentThinkingStepID.s
	if !st.currentThinkingStepID.ok {
		step = entity
	}
	st.thinkingStepSignatures[step] = value
	st.addStep(step, "")
	b.updateThinkingPart(id, step, st.thinkingSteps[step], value)
}

func (b *builder) attachToolCallSignature(callID, sig string) {
	with := func(md json.RawMessage) json.RawMessage {
		m := map[string]json.RawMessage{}
		if isObject(md) {
			m = object(md)
		}
		m["thoughtSignature"] = mustJSON(sig)
		return mustJSON(m)
	}
	for i := range b.msgs {
		for j := range b.msgs[i].Parts {
			if p := &b.msgs[i].Parts[j]; p.Type == "tool-call" && p.ID == callID {
				p.Metadata, p.Raw = with(p.Metadata), nil
			}
		}
	}
	for _, st := range b.states {
		if tc := st.toolCalls[callID]; tc != nil {
			tc.metadata = with(tc.metadata)
		}
	}
}

func (b *builder) updateThinkingPart(id, step, content, sig string) {
	s := step
	p := Part{Type: "thinking", Content: content, StepID: &s, Signature: sig}
	b.each(id, func(m *Message) {
		for i := range m.Parts {
			if q := m.Parts[i]; q.Type == "thinking" && q.StepID != nil && *q.StepID == step {
				m.Parts[i] = p
				return
			}
		}
		m.Parts = append(m.Parts, p)
	})
}
