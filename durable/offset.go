package durable

import (
	"fmt"
	"strconv"
)

// zeroOffset is the offset before every message: a new stream's tail.
const zeroOffset = "0000000000000000_0000000000000000"

// maxOffsetSeq is the largest sequence an offset can hold (16 decimal digits).
const maxOffsetSeq = 9999999999999999

// formatOffset returns the offset after the message of stream sequence seq.
func formatOffset(seq uint64) string {
	return fmt.Sprintf("%016d_0000000000000000", seq)
}

// parseOffset parses an offset formatOffset wrote. It accepts nothing else: not "-1", "now"
// nor a different width, so every malformed offset is refused.
func parseOffset(s string) (uint64, bool) {
	if len(s) != 33 || s[16] != '_' || s[17:] != "0000000000000000" {
		return 0, false
	}
	for i := 0; i < 16; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	seq, err := strconv.ParseUint(s[:16], 10, 64)
	return seq, err == nil
}
