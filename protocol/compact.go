package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/wsgateway/wsgateway/internal/jsoncompact"
)

// compactJSON appends src to dst without insignificant whitespace, checking
// that src is exactly one JSON value. It is the hot path of every decode; on
// invalid input it defers to encoding/json for the error text.
func compactJSON(dst, src []byte) ([]byte, error) {
	if out, ok := jsoncompact.Append(dst, src); ok {
		return out, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, src); err != nil {
		return dst, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	// encoding/json's verdict stands where it accepts what the fast path refused.
	return append(dst, buf.Bytes()...), nil
}
