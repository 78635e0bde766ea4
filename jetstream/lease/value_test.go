package lease

import (
	"testing"

	"github.com/wsgateway/wsgateway/internal/jsonenc/jsonenctest"
)

// TestValueJSON holds Value.Encode to json.Marshal's bytes, every field set at random.
func TestValueJSON(t *testing.T) {
	jsonenctest.Check(t, func(v Value) ([]byte, error) { return v.Encode(), nil })
}
