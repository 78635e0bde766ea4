package protocol

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
)

// This file ports the CompatibilityBoundary of @ag-ui/client 1.0.0
// (AGUI.md section 4.2): legacy THINKING_* events and null optionals
// become clean 1.0 events before the schema check.

// upgrader holds the ids minted for the open legacy thinking span and message.
type upgrader struct {
	span, msg string
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("protocol: crypto/rand: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// upgrade returns e in its 1.0 form (e itself when nothing changes). The only
// failure is the client's own: a null entry among the messages it upgrades.
func (u *upgrader) upgrade(e *Event) (*Event, error) {
	ms := e.m
	changed := false
	drop := func(key string) {
		if !isNull(lookup(ms, key)) {
			return
		}
		out := make([]member, 0, len(ms))
		for _, m := range ms {
			if m.key != key {
				out = append(out, m)
			}
		}
		ms, changed = out, true
	}
	set := func(key string, val []byte) {
		out := make([]member, 0, len(ms)+1)
		found := false
		for _, m := range ms {
			if m.key == key {
				if found {
					continue
				}
				m.val, found = val, true
			}
			out = append(out, m)
		}
		if !found {
			out = append(out, mem(key, val))
		}
		ms, changed = out, true
	}
	drop("rawEvent")
	if e.typ == RunFinished || e.typ == SubagentFinished {
		drop("result")
	}
	id := func(cur string) []byte {
		if cur == "" {
			cur = newUUID() // minted for this event only: verification rejects it
		}
		return appendString(nil, cur)
	}
	switch e.typ {
	case "THINKING_START":
		u.span = newUUID()
		if lookup(ms, "title") != nil {
			out := make([]member, 0, len(ms))
			for _, m := range ms {
				if m.key != "title" {
					out = append(out, m)
				}
			}
			ms = out
		}
		set("type", quoteType(ReasoningStart))
		set("messageId", appendString(nil, u.span))
	case "THINKING_TEXT_MESSAGE_START":
		u.msg = newUUID()
		set("type", quoteType(ReasoningMessageStart))
		set("messageId", appendString(nil, u.msg))
		set("role", reasoningToken)
	case "THINKING_TEXT_MESSAGE_CONTENT":
		set("type", quoteType(ReasoningMessageContent))
		set("messageId", id(u.msg))
	case "THINKING_TEXT_MESSAGE_END":
		set("type", quoteType(ReasoningMessageEnd))
		set("messageId", id(u.msg))
		u.msg = ""
	case "THINKING_END":
		set("type", quoteType(ReasoningEnd))
		set("messageId", id(u.span))
		u.span = ""
	case ToolCallStart, ToolCallChunk:
		drop("parentMessageId")
	case RunFinished:
		drop("outcome")
	case MessagesSnapshot:
		if msgs := lookup(ms, "messages"); isArray(msgs) {
			v, ok, err := upgradeMessages(msgs)
			if err != nil {
				return nil, err
			}
			if ok {
				set("messages", v)
			}
		}
	case RunStarted:
		if in := lookup(ms, "input"); isObject(in) {
			v, ok, err := upgradeInput(in)
			if err != nil {
				return nil, err
			}
			if ok {
				set("input", v)
			}
		}
	}
	if !changed {
		return e, nil
	}
	return eventFromMembers(ms), nil
}

// dropNull returns the object obj without key when its value is null.
func dropNull(obj []byte, key string) ([]byte, bool) {
	if !isObject(obj) {
		return obj, false
	}
	ms := splitObject(obj, nil)
	if !isNull(lookup(ms, key)) {
		return obj, false
	}
	out := ms[:0:0]
	for _, m := range ms {
		if m.key != key {
			out = append(out, m)
		}
	}
	return appendObject(nil, out), true
}

// replaceMember returns obj with key set to val.
func replaceMember(obj []byte, key string, val []byte) []byte {
	ms := splitObject(obj, nil)
	for i := range ms {
		if ms[i].key == key {
			ms[i].val = val
		}
	}
	return appendObject(nil, ms)
}

// upgradeInput drops the legacy nulls of a RunAgentInput and upgrades its messages.
func upgradeInput(in []byte) ([]byte, bool, error) {
	changed := false
	if v, ok := dropNull(in, "forwardedProps"); ok {
		in, changed = v, true
	}
	for _, f := range []struct{ list, key string }{{"tools", "parameters"}, {"resume", "payload"}} {
		arr := lookup(splitObject(in, nil), f.list)
		if v, ok := mapArray(arr, func(el []byte) ([]byte, bool) { return dropNull(el, f.key) }); ok {
			in, changed = replaceMember(in, f.list, v), true
		}
	}
	msgs := lookup(splitObject(in, nil), "messages")
	if !isArray(msgs) {
		return in, changed, nil
	}
	v, ok, err := upgradeMessages(msgs)
	if err != nil {
		return nil, false, err
	}
	if ok {
		in, changed = replaceMember(in, "messages", v), true
	}
	return in, changed, nil
}

// mapArray applies f to each element of a JSON array.
func mapArray(arr []byte, f func([]byte) ([]byte, bool)) ([]byte, bool) {
	if !isArray(arr) {
		return arr, false
	}
	els := splitArray(arr, nil)
	changed := false
	for i, el := range els {
		if v, ok := f(el); ok {
			els[i], changed = v, true
		}
	}
	if !changed {
		return arr, false
	}
	return appendArray(nil, els), true
}

func appendArray(dst []byte, els [][]byte) []byte {
	dst = append(dst, '[')
	for i, el := range els {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, el...)
	}
	return append(dst, ']')
}

var mediaTypes = map[string]bool{"image": true, "audio": true, "video": true, "document": true}

// upgradeMessages upgrades each message: a null media-part metadata is
// removed, and legacy binary parts become media parts.
func upgradeMessages(arr []byte) ([]byte, bool, error) {
	els := splitArray(arr, nil)
	changed := false
	for i, msg := range els {
		if isNull(msg) {
			// The client reads msg.content and fails with a TypeError.
			return nil, false, violation("Cannot read properties of null (reading 'content')")
		}
		if !isObject(msg) {
			continue
		}
		content := lookup(splitObject(msg, nil), "content")
		if !isArray(content) {
			continue
		}
		parts := splitArray(content, nil)
		partsChanged, hasBinary := false, false
		for j, p := range parts {
			if !isObject(p) {
				continue
			}
			pm := splitObject(p, nil)
			pt := lookup(pm, "type")
			if mediaTypes[unquote(pt)] && isString(pt) {
				if v, ok := dropNull(p, "metadata"); ok {
					parts[j], partsChanged = v, true
				}
			}
			if isString(pt) && unquote(pt) == "binary" {
				hasBinary = true
			}
		}
		if hasBinary {
			if v, ok := upgradeBinary(parts); ok {
				parts, partsChanged = v, true
			}
		}
		if partsChanged {
			els[i], changed = replaceMember(msg, "content", appendArray(nil, parts)), true
		}
	}
	if !changed {
		return arr, false, nil
	}
	return appendArray(nil, els), true, nil
}

// truthy reports whether a JSON value is truthy in JavaScript.
func truthy(v []byte) bool {
	switch {
	case v == nil, isNull(v), string(v) == "false", string(v) == `""`:
		return false
	case kindOf(v) == "number":
		f, _ := strconv.ParseFloat(string(v), 64)
		return f != 0
	}
	return true
}

// upgradeBinary converts the legacy binary parts of a content array. A
// converted part that duplicates a media part already in the array is
// dropped; a part with neither data nor url stays as it is.
func upgradeBinary(parts [][]byte) ([][]byte, bool) {
	out := make([][]byte, 0, len(parts))
	changed := false
	for _, p := range parts {
		if !isObject(p) {
			out = append(out, p)
			continue
		}
		pm := splitObject(p, nil)
		mime := lookup(pm, "mimeType")
		if t := lookup(pm, "type"); !isString(t) || unquote(t) != "binary" || !isString(mime) {
			out = append(out, p)
			continue
		}
		var srcType string
		var value []byte
		if d := lookup(pm, "data"); truthy(d) {
			srcType, value = "data", d
		} else if u := lookup(pm, "url"); truthy(u) {
			srcType, value = "url", u
		} else {
			out = append(out, p)
			continue
		}
		kind := mediaKind(unquote(mime))
		src := appendObject(nil, []member{mem("type", appendString(nil, srcType)), mem("value", value), mem("mimeType", mime)})
		np := []member{mem("type", appendString(nil, kind)), mem("source", src)}
		filename := lookup(pm, "filename")
		if truthy(filename) {
			np = append(np, mem("metadata", appendObject(nil, []member{mem("filename", filename)})))
		}
		changed = true
		if hasMediaPart(parts, kind, srcType, value, mime, filename) {
			continue
		}
		out = append(out, appendObject(nil, np))
	}
	return out, changed
}

func mediaKind(mime string) string {
	switch {
	case strings.HasPrefix(mime, "image/"):
		return "image"
	case strings.HasPrefix(mime, "audio/"):
		return "audio"
	case strings.HasPrefix(mime, "video/"):
		return "video"
	}
	return "document"
}

// hasMediaPart reports whether parts already holds the media part a binary
// part converts to (same kind and source, and the same filename if any).
func hasMediaPart(parts [][]byte, kind, srcType string, value, mime, filename []byte) bool {
	for _, p := range parts {
		if !isObject(p) {
			continue
		}
		pm := splitObject(p, nil)
		if t := lookup(pm, "type"); !isString(t) || unquote(t) != kind {
			continue
		}
		src := lookup(pm, "source")
		if !isObject(src) {
			continue
		}
		sm := splitObject(src, nil)
		if !jsEqual(lookup(sm, "type"), appendString(nil, srcType)) || !jsEqual(lookup(sm, "value"), value) || !jsEqual(lookup(sm, "mimeType"), mime) {
			continue
		}
		if !truthy(filename) {
			return true
		}
		md := lookup(pm, "metadata")
		if isObject(md) && jsEqual(lookup(splitObject(md, nil), "filename"), filename) {
			return true
		}
	}
	return false
}

// jsEqual is JavaScript's === on two JSON primitives (objects never compare equal).
func jsEqual(a, b []byte) bool {
	if a == nil || b == nil || isObject(a) || isArray(a) || isObject(b) || isArray(b) {
		return false
	}
	if isString(a) && isString(b) {
		return unquote(a) == unquote(b)
	}
	if kindOf(a) == "number" && kindOf(b) == "number" {
		fa, _ := strconv.ParseFloat(string(a), 64)
		fb, _ := strconv.ParseFloat(string(b), 64)
		return fa == fb
	}
	return string(a) == string(b)
}
