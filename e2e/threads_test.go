package e2e

import (
	"encoding/json"
	"fmt"
	"reflect"
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
				if len(res.Live) != 6 {
					t.Errorf("the live client shows %d messages, want 6: %s", len(res.Live), join(res.Live))
				}
				sameMessages(t, res)
			})
		}
	}
}
