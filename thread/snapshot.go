package thread

import (
	"encoding/json"
	"slices"
)

// CUSTOM events (approval-requested) and MESSAGES_SNAPSHOT, reconciled with what the run built.

func (b *builder) custom(e *event) {
	name, _ := e.str("name")
	if name != "approval-requested" {
		return
	}
	v := object(e.raw("value"))
	if v == nil {
		return
	}
	callID, _ := asString(v["toolCallId"])
	approvalID, _ := asString(object(v["approval"])["id"])
	target := b.activeAssistantID()
	if !target.ok {
		if id, ok := b.toolCallToMessage[callID]; ok {
			target = some(id)
		}
	}
	if target.truthy() {
		b.updateToolCallApproval(target.s, callID, approvalID)
	}
}

// --- MESSAGES_SNAPSHOT

// messagesSnapshot replaces the messages with the snapshot's (handleMessagesSnapshotEvent):
// each converted as aguiSnapshotMessageToUIMessage does, thinking-only messages folded into
// the next assistant, tool results anchored into the message of their call, calls given
// their results' output, and a message without metadata keeping the one it had.
func (b *builder) messagesSnapshot(e *event) {
	b.prepareAssistantMessage()
	var list []json.RawMessage
	_ = json.Unmarshal(e.raw("messages"), &list)
	prev := b.msgs
	next := make([]Message, 0, len(list))
	for _, raw := range list {
		next = append(next, b.snapshotMessage(object(raw)))
	}
	next = b.reconcileSnapshotToolCalls(mergeReasoningFanOut(next), prev)
	for i := range next {
		if next[i].Metadata != nil {
			continue
		}
		for j := len(prev) - 1; j >= 0; j-- {
			if prev[j].ID == next[i].ID {
				next[i].Metadata = prev[j].Metadata
				break
			}
		}
	}
	b.msgs = next
}

// snapshotMessage converts one AG-UI message (aguiSnapshotMessageToUIMessage). Not ported:
// messages that carry "parts", "name", tanstack.toolResult ownership, structured output and
// ui resources.
func (b *builder) snapshotMessage(m map[string]json.RawMessage) Message {
	id, _ := asString(m["id"])
	if id == "" {
		id = b.mint("a")
	}
	role, _ := asString(m["role"])
	out := Message{ID: id, Role: "assistant", Parts: []Part{}}
	content := m["content"]
	switch role {
	case "user":
		out.Role = "user"
		if s, ok := asString(content); ok {
			if s != "" {
				out.Parts = append(out.Parts, Part{Type: "text", Content: s})
			}
		} else {
			out.Parts = append(out.Parts, userParts(content)...)
		}
	case "assistant":
		out.Parts = append(out.Parts, contentParts(content)...)
		var callMetadata map[string]json.RawMessage
		if t := tanstackOf(m); t != nil && isObject(t["toolCallMetadata"]) {
			callMetadata = object(t["toolCallMetadata"])
		}
		var calls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		_ = json.Unmarshal(m["toolCalls"], &calls)
		for _, c := range calls {
			out.Parts = append(out.Parts, Part{Type: "tool-call", ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments,
				State: "input-complete", Input: parseJSON(c.Function.Arguments), Metadata: callMetadata[c.ID]})
		}
	case "tool":
		if md := m["metadata"]; !nullish(md) {
			out.Metadata = md
		}
		callID, _ := asString(m["toolCallId"])
		if callID == "" {
			out.Parts = append(out.Parts, contentParts(content)...)
		} else {
			p := Part{Type: "tool-result", ToolCallID: callID, State: "complete"}
			if s, ok := asString(content); ok {
				p.Content = s
			} else if len(content) > 0 && content[0] == '[' {
				p.ContentParts = content
			}
			if rid, ok := asString(m["id"]); ok {
				p.ID = rid
			}
			p.Metadata = out.Metadata
			if errv, ok := m["error"]; ok {
				p.State = "error"
				p.Error, _ = asString(errv)
			}
			out.Parts = append(out.Parts, p)
		}
	case "system", "developer":
		out.Role = "system"
		if s, _ := asString(content); s != "" {
			out.Parts = append(out.Parts, Part{Type: "text", Content: s})
		}
	case "reasoning":
		sig, _ := asString(m["encryptedValue"])
		if sig == "" {
			if t := tanstackOf(m); t != nil {
				sig, _ = asString(t["signature"])
			}
		}
		text, _ := asString(content)
		if text != "" || sig != "" {
			out.Parts = append(out.Parts, Part{Type: "thinking", Content: text, Signature: sig})
		}
	}
	// applySnapshotMetadata
	if md := m["metadata"]; isObject(md) {
		out.Metadata = md
		if t := tanstackOf(object(md)); t != nil {
			out.CreatedAt = coerceCreatedAt(t["createdAt"])
		}
	}
	return out
}

// contentParts is modelMessageToUIMessage's parts of a content: an array's
// parts verbatim, else a text part of a non-empty string.
func contentParts(content json.RawMessage) []Part {
	if len(content) > 0 && content[0] == '[' {
		var list []json.RawMessage
		_ = json.Unmarshal(content, &list)
		parts := make([]Part, 0, len(list))
		for _, p := range list {
			typ, _ := asString(object(p)["type"])
			parts = append(parts, Part{Type: typ, Raw: p})
		}
		return parts
	}
	if s, _ := asString(content); s != "" {
		return []Part{{Type: "text", Content: s}}
	}
	return nil
}

func thinkingOnly(m Message) bool {
	if m.Role != "assistant" || len(m.Parts) == 0 {
		return false
	}
	for _, p := range m.Parts {
		if p.Type != "thinking" {
			return false
		}
	}
	return true
}

func toolResultOnly(m Message) bool {
	if m.Role != "assistant" {
		return false
	}
	results := 0
	for _, p := range m.Parts {
		switch p.Type {
		case "tool-result":
			results++
		case "ui-resource":
		default:
			return false
		}
	}
	return results > 0
}

// mergeReasoningFanOut folds leading thinking-only messages into the next
// assistant message that is not a tool-result-only one.
func mergeReasoningFanOut(msgs []Message) []Message {
	var out, pending []Message
	for _, m := range msgs {
		if thinkingOnly(m) {
			pending = append(pending, m)
			continue
		}
		if m.Role == "assistant" && len(pending) > 0 && !toolResultOnly(m) {
			var parts []Part
			for _, p := range pending {
				parts = append(parts, p.Parts...)
			}
			m.Parts = append(parts, m.Parts...)
			out = append(out, m)
			pending = nil
			continue
		}
		out = append(out, pending...)
		pending = nil
		out = append(out, m)
	}
	return append(out, pending...)
}

func (b *builder) reconcileSnapshotToolCalls(snapshot, prev []Message) []Message {
	prevCalls := map[string]Part{}
	for _, m := range prev {
		for _, p := range m.Parts {
			if p.Type == "tool-call" {
				prevCalls[p.ID] = p
			}
		}
	}
	snapshotCalls := map[string]bool{}
	for _, m := range snapshot {
		for _, p := range m.Parts {
			if p.Type == "tool-call" {
				snapshotCalls[p.ID] = true
			}
		}
	}
	out := []Message{}
	for _, m := range snapshot {
		var result *Part
		if m.Role == "assistant" && toolResultOnly(m) {
			for i := range m.Parts {
				if m.Parts[i].Type == "tool-result" {
					if result != nil {
						result = nil
						break
					}
					result = &m.Parts[i]
				}
			}
		}
		if result == nil {
			out = append(out, m)
			continue
		}
		target := -1
		for i := len(out) - 1; i >= 0 && target < 0; i-- {
			for _, p := range out[i].Parts {
				if p.Type == "tool-call" && p.ID == result.ToolCallID {
					target = i
					break
				}
			}
		}
		for i := len(out) - 1; i >= 0 && target < 0; i-- {
			if out[i].Role == "assistant" && !(len(out[i].Parts) == 1 && out[i].Parts[0].Type == "tool-result") {
				target = i
			}
		}
		if target < 0 {
			out = append(out, m)
			continue
		}
		parts := append([]Part(nil), out[target].Parts...)
		has := false
		for _, p := range parts {
			if p.Type == "tool-call" && p.ID == result.ToolCallID {
				has = true
			}
		}
		if !snapshotCalls[result.ToolCallID] && !has {
			if p, ok := prevCalls[result.ToolCallID]; ok {
				parts = append(parts, p)
				snapshotCalls[p.ID] = true
			}
		}
		out[target].Parts = append(parts, m.Parts...)
	}
	return enrichSnapshotToolCalls(out, prevCalls)
}

// enrichSnapshotToolCalls gives calls the output and state of their pre-snapshot
// part, or of their tool-result part.
func enrichSnapshotToolCalls(msgs []Message, prevCalls map[string]Part) []Message {
	results := map[string]Part{}
	for _, m := range msgs {
		for _, p := range m.Parts {
			if p.Type == "tool-result" {
				results[p.ToolCallID] = p
			}
		}
	}
	for i := range msgs {
		for j := range msgs[i].Parts {
			p := &msgs[i].Parts[j]
			if p.Type != "tool-call" {
				continue
			}
			p.Raw = nil
			if prev, ok := prevCalls[p.ID]; ok && (prev.Output != nil || prev.State == "complete" || prev.State == "error") &&
				(p.Output == nil || p.State == "input-complete" || p.State == "input-streaming" || p.State == "awaiting-input") {
				if prev.Output != nil {
					p.Output = prev.Output
				}
				p.State = prev.State
				if prev.Approval != nil {
					a := *prev.Approval
					p.Approval = &a
				}
				if prev.Metadata != nil {
					p.Metadata = prev.Metadata
				}
			}
			r, ok := results[p.ID]
			if !ok || p.Output != nil {
				continue
			}
			output := r.ContentParts
			if output == nil {
				if output = parseJSON(r.Content); output == nil {
					output = mustJSON(r.Content)
				}
			}
			if r.State == "error" {
				p.Output = mustJSON(map[string]string{"error": toolResultError(output)})
				p.State = "error"
			} else {
				p.Output = output
				p.State = "complete"
			}
		}
	}
	return msgs
}

// addOnce appends id to the set *ids unless it is there.
func addOnce(ids *[]string, id string) {
	if !slices.Contains(*ids, id) {
		*ids = append(*ids, id)
	}
}

// remove takes id out of the set *ids.
func remove(ids *[]string, id string) {
	if i := slices.Index(*ids, id); i >= 0 {
		*ids = slices.Delete(*ids, i, i+1)
	}
}
