package threadstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/wsgateway/wsgateway/protocol"
)

// hydrated is a hydrate's page as a client reads it: ids in order, each message's text and
// metadata.branch.
type hydrated struct {
	ids      []string
	text     map[string]string
	branches map[string]Branch
}

func hydrate(t *testing.T, s *Store, threadID string, limit int) hydrated {
	t.Helper()
	ctx := context.Background()
	th, err := s.Thread(ctx, "alice", threadID)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Hydrate(ctx, th, "", nil, limit, "")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []struct {
		ID    string `json:"id"`
		Parts []struct {
			Type    string `json:"type"`
			Content string `json:"content"`
		} `json:"parts"`
		Metadata struct {
			Branch *Branch `json:"branch"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(p.Messages, &msgs); err != nil {
		t.Fatal(err)
	}
	h := hydrated{text: map[string]string{}, branches: map[string]Branch{}}
	for _, m := range msgs {
		h.ids = append(h.ids, m.ID)
		for _, part := range m.Parts {
			if part.Type == "text" {
				h.text[m.ID] += part.Content
			}
		}
		if m.Metadata.Branch != nil {
			h.branches[m.ID] = *m.Metadata.Branch
		}
	}
	return h
}

// runTurn accepts runID with input and finishes it with a reply "re: <reply>".
// at reports whether the hydrate shows message id as sibling index of count.
func at(h hydrated, id string, index, count int) bool {
	b, ok := h.branches[id]
	return ok && b.Index == index && b.Count == count && len(b.Siblings) == count && b.Siblings[index-1] == id
}

func runTurn(t *testing.T, s *Store, threadID, runID, input, reply string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.AcceptRun(ctx, "alice", threadID, runID, json.RawMessage(input), nil, Overlap{}); err != nil {
		t.Fatalf("accept %s: %v", runID, err)
	}
	if err := s.FinishRun(ctx, "alice", threadID, runID, turnEvents(threadID, runID, reply)); err != nil {
		t.Fatalf("finish %s: %v", runID, err)
	}
	waitSealed(t, s)
}

// TestBranches: a regenerate keeps the reply it replaces as a sibling branch; two give three
// siblings, with metadata.branch on the one shown; switching shows the chosen one, to its
// leaf, and the agent's context follows; an edit keeps the edited message and what followed
// as a branch; an unknown message is refused; a run active on the thread holds switches.
func TestBranches(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	u1 := `{"id":"u1","role":"user","content":"question 1"}`
	runTurn(t, s, "T", "r1", `{"messages":[`+u1+`]}`, "one")
	// Regenerate twice: each posts the list up to u1 again.
	runTurn(t, s, "T", "r2", `{"messages":[`+u1+`]}`, "one again")
	runTurn(t, s, "T", "r3", `{"messages":[`+u1+`]}`, "one once more")
	h := hydrate(t, s, "T", 0)
	if !slices.Equal(h.ids, []string{"u1", "a-r3"}) || !at(h, "a-r3", 3, 3) || len(h.branches) != 1 {
		t.Fatalf("after two regenerates: %v, branches %v; want [u1 a-r3], a-r3 3 of 3", h.ids, h.branches)
	}
	// The third branch goes on with a second turn.
	runTurn(t, s, "T", "r4", `{"messages":[{"id":"u2","role":"user","content":"question 2"}]}`, "two")

	// Switch to the first reply.
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-r1"); err != nil {
		t.Fatal(err)
	}
	h = hydrate(t, s, "T", 0)
	if !slices.Equal(h.ids, []string{"u1", "a-r1"}) || !at(h, "a-r1", 1, 3) || h.text["a-r1"] != "re: one" {
		t.Fatalf("after switching to a-r1: %v, branches %v, text %q; want [u1 a-r1], a-r1 1 of 3", h.ids, h.branches, h.text["a-r1"])
	}
	th, _ := s.Thread(ctx, "alice", "T")
	msgs, _, err := s.AgentMessages(ctx, th, "next", nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := agentIDs(msgs); !slices.Equal(got, []string{"u1", "a-r1"}) {
		t.Fatalf("the agent's context after the switch: %v, want [u1 a-r1]", got)
	}
	// Switching by a message deep in a branch shows that branch to its leaf.
	if _, err := s.SwitchBranch(ctx, "alice", "T", "u2"); err != nil {
		t.Fatal(err)
	}
	h = hydrate(t, s, "T", 0)
	if !slices.Equal(h.ids, []string{"u1", "a-r3", "u2", "a-r4"}) || !at(h, "a-r3", 3, 3) {
		t.Fatalf("after switching to u2: %v, branches %v; want [u1 a-r3 u2 a-r4], a-r3 3 of 3", h.ids, h.branches)
	}

	// An edit of u2: u2 keeps its id with the new text; the old u2 and its reply are a branch.
	runTurn(t, s, "T", "r5", `{"messages":[`+u1+`,{"id":"a-r3","role":"assistant","content":"re: one once more"},{"id":"u2","role":"user","content":"question 2, edited"}]}`, "two edited")
	h = hydrate(t, s, "T", 0)
	if !slices.Equal(h.ids, []string{"u1", "a-r3", "u2", "a-r5"}) || h.text["u2"] != "question 2, edited" || !at(h, "u2", 2, 2) {
		t.Fatalf("after an edit of u2: %v, u2 %q, branches %v; want [u1 a-r3 u2 a-r5], the new text, u2 2 of 2", h.ids, h.text["u2"], h.branches)
	}
	if _, err := s.SwitchBranch(ctx, "alice", "T", "u2~r5"); err != nil {
		t.Fatal(err)
	}
	h = hydrate(t, s, "T", 0)
	if !slices.Equal(h.ids, []string{"u1", "a-r3", "u2~r5", "a-r4"}) || h.text["u2~r5"] != "question 2" || !at(h, "u2~r5", 1, 2) {
		t.Fatalf("after switching to the text before the edit: %v, branches %v; want [u1 a-r3 u2~r5 a-r4], 1 of 2", h.ids, h.branches)
	}

	if _, err := s.SwitchBranch(ctx, "alice", "T", "nope"); !errors.Is(err, ErrUnknownMessage) {
		t.Fatalf("switching to an unknown message: %v, want ErrUnknownMessage", err)
	}
	if _, err := s.AcceptRun(ctx, "alice", "T", "r6", turnInput("T", "r6", "u3", "question 3"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-r1"); !errors.As(err, &busy) || busy.ActiveRun != "r6" {
		t.Fatalf("switching while r6 runs: %v, want thread busy with r6", err)
	}
}

// TestBranchesSealed: in a long thread, a regenerate from a sealed message keeps what
// followed (sealed too) as a branch, and switching back restores it whole, in order.
func TestBranchesSealed(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	want := longThread(t, s, "T", 0, 30, func(k int, ids []string) []string { return ids[len(ids)-1:] })
	th, _ := s.Thread(ctx, "alice", "T")
	if th.Sealed == nil || th.Sealed.Count < 22 {
		t.Fatalf("sealed %+v, want ur10 sealed", th.Sealed)
	}
	input := `{"messages":[{"id":"ur9","role":"user","content":"question 9"},{"id":"a-r9","role":"assistant","content":"re: question 9"},{"id":"ur10","role":"user","content":"question 10"}]}`
	runTurn(t, s, "T", "regen", input, "question 10")
	if got := pageAll(t, s, "T", 7); !slices.Equal(got, append(slices.Clone(want[:21]), "a-regen")) {
		t.Fatalf("after a regenerate from ur10: %v", got)
	}
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-r25"); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, s)
	if got := pageAll(t, s, "T", 7); !slices.Equal(got, want) {
		t.Fatalf("after switching back: %d messages %v, want the %d of the thread before", len(got), got, len(want))
	}
	h := hydrate(t, s, "T", 0)
	if !at(h, "a-r10", 1, 2) || len(h.branches) != 1 {
		t.Fatalf("branches %v, want a-r10 1 of 2", h.branches)
	}
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-regen"); err != nil {
		t.Fatal(err)
	}
	if got := pageAll(t, s, "T", 0); !slices.Equal(got, append(slices.Clone(want[:21]), "a-regen")) {
		t.Fatalf("after switching to the regenerate again: %v", got)
	}
}

func agentIDs(msgs []protocol.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	return out
}

// regenerating returns a store whose thread T has a turn r1 and r2, accepted and not
// finished, regenerating r1's reply.
func regenerating(t *testing.T) *Store {
	t.Helper()
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	u1 := `{"id":"u1","role":"user","content":"question 1"}`
	runTurn(t, s, "T", "r1", `{"messages":[`+u1+`]}`, "one")
	if _, err := s.AcceptRun(ctx, "alice", "T", "r2", json.RawMessage(`{"messages":[`+u1+`]}`), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBranchStreaming: a regenerate's reply shows as the newest sibling while it streams.
func TestBranchStreaming(t *testing.T) {
	s := regenerating(t)
	ctx := context.Background()
	th, err := s.Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	events := turnEvents("T", "r2", "one again")
	p, err := s.Hydrate(ctx, th, "r2", events[:4], 0, "")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []struct {
		ID       string
		Metadata struct{ Branch *Branch }
	}
	json.Unmarshal(p.Messages, &msgs)
	if len(msgs) != 2 || msgs[1].ID != "a-r2" || msgs[1].Metadata.Branch == nil || msgs[1].Metadata.Branch.Index != 2 || msgs[1].Metadata.Branch.Count != 2 {
		t.Fatalf("while the regenerate streams the hydrate shows %s, want a-r2 as 2 of 2", p.Messages)
	}
}

// TestBranchSwitchPaused: a switch that would leave a run's question (an approval) unanswered
// in the branch it leaves is refused, naming that run; a switch to where it stands is not.
func TestBranchSwitchPaused(t *testing.T) {
	s := regenerating(t)
	ctx := context.Background()
	events := turnEvents("T", "r2", "one again")
	events[len(events)-1] = json.RawMessage(`{"type":"RUN_FINISHED","threadId":"T","runId":"r2","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`)
	if err := s.FinishRun(ctx, "alice", "T", "r2", events); err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-r1"); !errors.As(err, &busy) || busy.ActiveRun != "r2" {
		t.Fatalf("a switch away from the paused r2: %v, want thread busy naming r2", err)
	}
	if _, err := s.SwitchBranch(ctx, "alice", "T", "a-r2"); err != nil {
		t.Fatalf("a switch to the branch shown: %v", err)
	}
}

// BenchmarkSwitchBranch: a switch between the two branches of a 300-turn thread that forked
// at turn fork (a regenerate of that turn's reply): what moves is the fork's message and
// every message after it, on both branches.
func BenchmarkSwitchBranch(b *testing.B) {
	for _, fork := range []int{295, 150, 10} {
		b.Run("fork at turn "+strconv.Itoa(fork), func(b *testing.B) {
			s := openStore(b, testConfig(b))
			ctx := context.Background()
			longThread(b, s, "T", 0, 300, func(k int, ids []string) []string { return ids[len(ids)-1:] })
			// The list up to the question answered again (its last two messages: a lone
			// message the head does not know is taken as new).
			q := fmt.Sprintf(`{"id":"a-r%d","role":"assistant","content":"re: question %d"},{"id":"ur%d","role":"user","content":"question %d"}`, fork-1, fork-1, fork, fork)
			if _, err := s.AcceptRun(ctx, "alice", "T", "regen", json.RawMessage(`{"messages":[`+q+`]}`), nil, Overlap{}); err != nil {
				b.Fatal(err)
			}
			if err := s.FinishRun(ctx, "alice", "T", "regen", turnEvents("T", "regen", "again")); err != nil {
				b.Fatal(err)
			}
			waitSealed(b, s)
			targets := []string{fmt.Sprintf("a-r%d", fork), "a-regen"}
			i := 0
			for b.Loop() {
				if _, err := s.SwitchBranch(ctx, "alice", "T", targets[i%2]); err != nil {
					b.Fatal(err)
				}
				waitSealed(b, s)
				i++
			}
			// The branch shown last holds its own messages to its leaf.
			want := 2*fork + 2 // through the fork's turn and its regenerated reply
			if i%2 == 1 {
				want = 600
			}
			if got := len(pageAll(b, s, "T", 0)); got != want {
				b.Fatalf("after %d switches the thread shows %d messages, want %d", i, got, want)
			}
		})
	}
}
