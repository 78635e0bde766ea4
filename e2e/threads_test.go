package e2e

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Threads with the real @tanstack/ai-client: a ChatClient with persistence: true that sends
// turns, then a fresh one (a reload, another tab or device) that hydrates the thread from a
// gateway process; testdata/npm/tanstack-threads.mjs drives both.

const threadsScript = "tanstack-threads.mjs"

// threadTurn is one message the live client sends, with the demo agent's options.
type threadTurn struct {
	Text           string         `json:"text"`
	ForwardedProps map[string]any `json:"forwardedProps,omitempty"`
}

// reloadResult is what the script's reload and older scenarios print.
type reloadResult struct {
	Live     []json.RawMessage `json:"live"`
	Hydrated []json.RawMessage `json:"hydrated"`
	Pages    int               `json:"pages"`
}

// sameMessages fails unless the reloaded client shows the live client's messages.
func sameMessages(t *testing.T, res reloadResult) {
	t.Helper()
	decode := func(ms []json.RawMessage) []any {
		out := make([]any, len(ms))
		for i, m := range ms {
			json.Unmarshal(m, &out[i])
		}
		return out
	}
	live, hydrated := decode(res.Live), decode(res.Hydrated)
	if len(live) == 0 || !reflect.DeepEqual(live, hydrated) {
		t.Fatalf("reloaded client's messages differ from the live client's:\nlive:     %s\nhydrated: %s", join(res.Live), join(res.Hydrated))
	}
}

func join(ms []json.RawMessage) string {
	b, _ := json.Marshal(ms)
	return string(b)
}

// TestThreadsReloadShowsEveryTurn: finished text turns and a failed one hydrate, on every
// adapter, exactly as a client that never reloaded shows them, from the gateway that ran them
// and from a second gateway process on the same NATS.
func TestThreadsReloadShowsEveryTurn(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	turns := []threadTurn{
		{Text: "hello there", ForwardedProps: demoProps(map[string]any{"intervalMs": 0})},
		{Text: "now fail", ForwardedProps: demoProps(map[string]any{"intervalMs": 0, "fail": "middle"})},
		{Text: "and count", ForwardedProps: demoProps(map[string]any{"intervalMs": 0, "tokens": 5})},
		{Text: "think and call", ForwardedProps: demoProps(map[string]any{"intervalMs": 0, "tokens": 2, "reasoning": true, "toolCall": true})},
	}
	for _, adapter := range []string{"fetch-sse", "xhr-sse", "fetch-ndjson", "xhr-ndjson", "ws"} {
		for _, elsewhere := range []bool{false, true} {
			name, hydrateBase := adapter+"/same gateway", gw.URL
			if elsewhere {
				name, hydrateBase = adapter+"/other gateway", other.URL
			}
			t.Run(name, func(t *testing.T) {
				var res reloadResult
				runNode(t, threadsScript, nil, &res, "reload", adapter, options(t, map[string]any{
					"base": gw.URL, "hydrateBase": hydrateBase, "threadId": fmt.Sprintf("thread-%s-%v", adapter, elsewhere),
					"turns": turns,
				}))
				if len(res.Live) != 8 {
					t.Errorf("the live client shows %d messages, want 8: %s", len(res.Live), join(res.Live))
				}
				sameMessages(t, res)
			})
		}
	}
}

// fast is the demo agent without pauses.
var fast = demoProps(map[string]any{"intervalMs": 0})

// uiMessage is what the tests inspect of a UIMessage.
type uiMessage struct {
	ID    string `json:"id"`
	Role  string `json:"role"`
	Parts []struct {
		Type     string `json:"type"`
		Content  string `json:"content"`
		State    string `json:"state"`
		Approval *struct {
			ID       string `json:"id"`
			Approved *bool  `json:"approved"`
		} `json:"approval"`
	} `json:"parts"`
}

// decodeMessages decodes messages for inspection.
func decodeMessages(t *testing.T, ms []json.RawMessage) []uiMessage {
	t.Helper()
	var out []uiMessage
	if err := json.Unmarshal([]byte(join(ms)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestThreadsTurnAfterPagedReload: a client reloaded with history.pageSize sends a turn; the
// thread stays whole (a full reload shows every earlier turn and the new one).
func TestThreadsTurnAfterPagedReload(t *testing.T) {
	gw := startGateway(t)
	var res struct {
		Live, Paged, Hydrated []json.RawMessage
	}
	runNode(t, threadsScript, nil, &res, "pageturn", "fetch-sse", options(t, map[string]any{
		"base": gw.URL, "threadId": "thread-paged", "pageSize": 2,
		"turns": []threadTurn{{"one", fast}, {"two", fast}, {"three", fast}},
		"next":  threadTurn{"four", fast},
	}))
	if len(res.Live) != 6 || len(res.Hydrated) != 8 {
		t.Fatalf("live %d messages, after the paged client's turn %d, want 6 and 8:\n%s", len(res.Live), len(res.Hydrated), join(res.Hydrated))
	}
	sameMessages(t, reloadResult{Live: res.Live, Hydrated: res.Hydrated[:6]})
	sameMessages(t, reloadResult{Live: res.Paged[len(res.Paged)-2:], Hydrated: res.Hydrated[6:]})
}

// TestThreadsLoadOlderMessages: a reload with history.pageSize pages back through a
// 60-message thread with loadOlderMessages() to its first message, with no duplicate.
func TestThreadsLoadOlderMessages(t *testing.T) {
	gw := startGateway(t)
	var turns []threadTurn
	for i := range 30 {
		turns = append(turns, threadTurn{fmt.Sprintf("message %d", i), fast})
	}
	var res reloadResult
	runNode(t, threadsScript, nil, &res, "older", "fetch-ndjson", options(t, map[string]any{
		"base": gw.URL, "threadId": "thread-older", "pageSize": 7, "turns": turns, "timeoutMs": 120000,
	}))
	if len(res.Live) != 60 || res.Pages != 8 {
		t.Errorf("live %d messages, %d older pages loaded, want 60 and 8 (pages of 7)", len(res.Live), res.Pages)
	}
	ids := map[string]bool{}
	for _, m := range decodeMessages(t, res.Hydrated) {
		if ids[m.ID] {
			t.Errorf("message %s twice", m.ID)
		}
		ids[m.ID] = true
	}
	sameMessages(t, res)
}

// TestThreadsReloadMidTurn: a client reloaded while a turn streams (with reasoning and a
// tool call) ends with the same messages as the client that never reloaded.
func TestThreadsReloadMidTurn(t *testing.T) {
	gw := startGateway(t)
	for _, adapter := range []string{"fetch-sse", "xhr-ndjson", "ws"} {
		t.Run(adapter, func(t *testing.T) {
			var res reloadResult
			runNode(t, threadsScript, nil, &res, "midturn", adapter, options(t, map[string]any{
				"base": gw.URL, "threadId": "thread-midturn-" + adapter, "reloadAfterChars": 9,
				"turns": []threadTurn{
					{"first", fast},
					{"second", demoProps(map[string]any{"tokens": 40, "intervalMs": 25, "reasoning": true, "toolCall": true})},
				},
			}))
			if len(res.Live) != 4 {
				t.Errorf("the live client shows %d messages, want 4: %s", len(res.Live), join(res.Live))
			}
			sameMessages(t, res)
		})
	}
}

// TestThreadsApprovalAfterReload: a turn that asks for approval rehydrates with the pending
// request; answering it after the reload completes the thread, which a further reload shows.
func TestThreadsApprovalAfterReload(t *testing.T) {
	gw := startGateway(t)
	var res struct {
		Live, Requested, Answered, Hydrated []json.RawMessage
	}
	runNode(t, threadsScript, nil, &res, "approval", "fetch-sse", options(t, map[string]any{
		"base": gw.URL, "threadId": "thread-approval",
		"turns": []threadTurn{{"check the weather", demoProps(map[string]any{"intervalMs": 0, "approval": true})}},
	}))
	sameMessages(t, reloadResult{Live: res.Live, Hydrated: res.Requested})
	sameMessages(t, reloadResult{Live: res.Answered, Hydrated: res.Hydrated})
	var approved, reply bool
	for _, m := range decodeMessages(t, res.Hydrated) {
		for _, p := range m.Parts {
			if p.Type == "tool-call" && p.Approval != nil && p.Approval.Approved != nil && *p.Approval.Approved {
				approved = true
			}
			if p.Type == "text" && strings.HasPrefix(p.Content, "Approved:") {
				reply = true
			}
		}
	}
	if !approved || !reply {
		t.Errorf("the answered thread shows approved %v, the reply %v:\n%s", approved, reply, join(res.Hydrated))
	}
}

// TestThreadsTwoGatewaysAtOnce: clients on two gateway processes send turns to one thread at
// the same time; a reload shows every turn.
func TestThreadsTwoGatewaysAtOnce(t *testing.T) {
	gw := startGateway(t)
	other := startGateway(t, "--nats-url", gw.NATSURL)
	var res reloadResult
	const turns = 5
	var ts []threadTurn
	for i := range turns {
		ts = append(ts, threadTurn{fmt.Sprintf("turn %d", i), fast})
	}
	runNode(t, threadsScript, nil, &res, "concurrent", "fetch-sse", options(t, map[string]any{
		"bases": []string{gw.URL, other.URL}, "base": gw.URL, "threadId": "thread-concurrent", "turns": ts,
	}))
	msgs := decodeMessages(t, res.Hydrated)
	seen := map[string]int{}
	replies := 0
	for _, m := range msgs {
		for _, p := range m.Parts {
			if p.Type == "text" && m.Role == "user" {
				seen[p.Content]++
			}
			if p.Type == "text" && m.Role == "assistant" {
				replies++
			}
		}
	}
	for client := range 2 {
		for i := range turns {
			if text := fmt.Sprintf("turn %d from %d", i, client); seen[text] != 1 {
				t.Errorf("%q shown %d times", text, seen[text])
			}
		}
	}
	if len(msgs) != 4*turns || replies != 2*turns {
		t.Errorf("the thread shows %d messages and %d replies, want %d and %d:\n%s", len(msgs), replies, 4*turns, 2*turns, join(res.Hydrated))
	}
}

// TestThreadsOtherPrincipalAndUnknownThread: with authentication, another principal's reload
// of a thread, and a reload of a thread that does not exist, show an empty chat; the owner's
// reload shows the thread.
func TestThreadsOtherPrincipalAndUnknownThread(t *testing.T) {
	gw := startSecGateway(t)
	auth := func(sub string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + gw.token(t, sub, nil)}
	}
	turns := []threadTurn{{"a secret", fast}}
	for _, tt := range []struct {
		name, sub, thread string
		empty             bool
	}{
		{"owner", "alice", "thread-private", false},
		{"another principal", "bob", "thread-private", true},
		{"unknown thread", "alice", "thread-never-used", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var res reloadResult
			runNode(t, threadsScript, nil, &res, "reload", "fetch-sse", options(t, map[string]any{
				"base": gw.URL, "threadId": "thread-private-" + tt.name, "turns": turns,
				"headers": auth("alice"), "hydrateHeaders": auth(tt.sub),
				"hydrateThreadId": strings.Replace(tt.thread, "thread-private", "thread-private-"+tt.name, 1),
			}))
			if len(res.Live) != 2 {
				t.Fatalf("the live client shows %s", join(res.Live))
			}
			if tt.empty && len(res.Hydrated) != 0 {
				t.Errorf("the reload shows %s, want nothing", join(res.Hydrated))
			}
			if !tt.empty {
				sameMessages(t, res)
			}
		})
	}
}

// TestThreadsRegenerateKeepsBranches (THREADS.md section 7): the real ChatClient's own
// regenerate (reload()) twice gives three sibling replies; a reload hydrates without error,
// shows what the live client shows (the newest reply), and marks that reply 3 of 3 in its
// metadata.branch, naming its siblings.
func TestThreadsRegenerateKeepsBranches(t *testing.T) {
	gw := startGateway(t)
	var res reloadResult
	runNode(t, threadsScript, nil, &res, "regenerate", "ws", options(t, map[string]any{
		"base": gw.URL, "threadId": "thread-regenerate", "regenerates": 2,
		"turns": []threadTurn{{Text: "hello there", ForwardedProps: demoProps(map[string]any{"intervalMs": 0})}},
	}))
	if len(res.Hydrated) != 2 {
		t.Fatalf("the reload shows %d messages, want 2: %s", len(res.Hydrated), join(res.Hydrated))
	}
	var reply struct {
		ID       string `json:"id"`
		Metadata struct {
			Branch struct {
				Index, Count int
				Siblings     []string
			} `json:"branch"`
		} `json:"metadata"`
	}
	json.Unmarshal(res.Hydrated[1], &reply)
	if b := reply.Metadata.Branch; b.Index != 3 || b.Count != 3 || len(b.Siblings) != 3 || b.Siblings[2] != reply.ID {
		t.Errorf("the reply's metadata.branch is %+v, want 3 of 3 naming it last: %s", b, res.Hydrated[1])
	}
	// Without the branch, the reload shows what the live client shows.
	var m map[string]any
	json.Unmarshal(res.Hydrated[1], &m)
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "branch")
		if len(md) == 0 {
			delete(m, "metadata")
		}
	}
	res.Hydrated[1], _ = json.Marshal(m)
	sameMessages(t, res)
}
