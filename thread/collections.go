package thread

// The builder's ordered collections: message states, their parts and segments, and the
// assistant message a run's events go to.

func (b *builder) state(id string) *msgState {
	for _, s := range b.states {
		if s.id == id {
			return s
		}
	}
	return nil
}

func (b *builder) deleteState(id string) {
	for i, s := range b.states {
		if s.id == id {
			b.states = append(b.states[:i], b.states[i+1:]...)
			return
		}
	}
}

// setState is Map.set: an existing key keeps its place.
func (b *builder) setState(id string, st *msgState) {
	for i, s := range b.states {
		if s.id == id {
			b.states[i] = st
			return
		}
	}
	b.states = append(b.states, st)
}

func (b *builder) find(id string) *Message {
	for i := range b.msgs {
		if b.msgs[i].ID == id {
			return &b.msgs[i]
		}
	}
	return nil
}

// each calls f on every message with the id (the updaters map over all of them).
func (b *builder) each(id string, f func(*Message)) {
	for i := range b.msgs {
		if b.msgs[i].ID == id {
			f(&b.msgs[i])
		}
	}
}

// segment is a text segment's bytes, appended to in place: a text part keeps
// the segment and its length when emitted, and becomes a string once (text),
// so that a long reply costs linear time, not a copy per delta.
type segment struct{ buf []byte }

// pending reports whether the segment has text not yet emitted.
func (st *msgState) pending() bool { return len(st.seg.buf) != st.emitted }

// text returns a text part's content, materialising it.
func (p *Part) text() string {
	if p.seg != nil {
		p.Content = string(p.seg.buf[:p.segN])
		p.seg = nil
	}
	return p.Content
}

// settle materialises every text part of msgs.
func settle(msgs []Message) {
	for i := range msgs {
		for j := range msgs[i].Parts {
			msgs[i].Parts[j].text()
		}
	}
}

func (b *builder) createMessageState(id, role string) *msgState {
	st := &msgState{
		id: id, role: role, seg: &segment{},
		thinkingSteps:          map[string]string{},
		thinkingStepSignatures: map[string]string{},
		toolCalls:              map[string]*toolCall{},
	}
	b.setState(id, st)
	return st
}

// addStep records a thinking step once, in order.
func (st *msgState) addStep(id, content string) {
	if _, ok := st.thinkingSteps[id]; !ok {
		st.thinkingSteps[id] = content
	}
}

func (b *builder) activeAssistantID() opt {
	for i := len(b.activeMessageIDs) - 1; i >= 0; i-- {
		id := b.activeMessageIDs[i]
		if s := b.state(id); s != nil && s.role == "assistant" {
			return some(id)
		}
	}
	for i := len(b.states) - 1; i >= 0; i-- {
		if b.states[i].role == "assistant" {
			return some(b.states[i].id)
		}
	}
	return opt{}
}

func (b *builder) resumeAssistantState(id string, st *msgState) {
	addOnce(&b.activeMessageIDs, id)
	if st.isComplete || b.isDone {
		st.isComplete = false
		b.isDone = false
	}
}

func (b *builder) ensureAssistantMessage(preferred opt) (string, *msgState) {
	if preferred.truthy() {
		if st := b.state(preferred.s); st != nil {
			b.resumeAssistantState(preferred.s, st)
			return preferred.s, st
		}
	}
	if active := b.activeAssistantID(); active.truthy() {
		if st := b.state(active.s); st != nil {
			b.resumeAssistantState(active.s, st)
			return active.s, st
		}
	}
	if preferred.truthy() {
		if m := b.find(preferred.s); m != nil {
			st := b.createMessageState(preferred.s, m.Role)
			addOnce(&b.activeMessageIDs, preferred.s)
			if n := len(m.Parts); n > 0 && m.Parts[n-1].Type == "text" {
				text := m.Parts[n-1].text()
				st.seg = &segment{buf: []byte(text)}
				st.emitted = len(text)
			}
			return preferred.s, st
		}
	}
	id := preferred.s
	if !preferred.truthy() {
		id = b.mint("a")
	}
	b.msgs = append(b.msgs, Message{ID: id, Role: "assistant", Parts: []Part{}, CreatedAt: b.now})
	st := b.createMessageState(id, "assistant")
	addOnce(&b.activeMessageIDs, id)
	b.pendingManualID = id
	return id, st
}
