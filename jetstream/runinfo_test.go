package jetstream

import (
	"testing"

	"github.com/wsgateway/wsgateway/internal/jsonenc/jsonenctest"
)

// TestRunInfoJSON holds RunInfo.appendJSON to json.Marshal's bytes, every field set at random.
func TestRunInfoJSON(t *testing.T) {
	jsonenctest.Check(t, func(info RunInfo) ([]byte, error) { return info.appendJSON(nil), nil })
}
