package conversation

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/wsgateway/wsgateway/protocol"
)

// TestAppendFrameCarves: a replay's envelopes carved from shared chunks are each exactly the
// envelope of its event, untouched by the envelopes carved after it and by an append to
// another one, an event larger than a chunk included; 1,000 short events cost a few chunks,
// not an allocation each.
func TestAppendFrameCarves(t *testing.T) {
	type sent struct {
		off   string
		ev    []byte
		frame []byte
	}
	var arena []byte
	var frames []sent
	for i := range 1000 {
		ev := fmt.Appendf(nil, `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"t%d "}`, i)
		if i == 500 {
			ev = fmt.Appendf(nil, `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"%s"}`, strings.Repeat("x", 2*replayArena))
		}
		off := fmt.Sprintf("000001-%012x-%04x-0123456789ab", 3, i)
		frames = append(frames, sent{off, ev, appendFrame(&arena, off, ev)})
	}
	// An append to a frame must not reach the next one's bytes.
	_ = append(frames[10].frame, "garbage"...)
	for i, f := range frames {
		if want := protocol.AppendEnvelope(nil, f.off, f.ev); !bytes.Equal(f.frame, want) {
			t.Fatalf("frame %d = %.80s…, want %.80s…", i, f.frame, want)
		}
	}
	allocs := testing.AllocsPerRun(10, func() {
		var arena []byte
		for _, f := range frames[:400] {
			appendFrame(&arena, f.off, f.ev)
		}
	})
	if allocs > 10 {
		t.Errorf("400 envelopes of about 100 bytes took %.0f allocations, want a chunk per %d bytes", allocs, replayArena)
	}
}
