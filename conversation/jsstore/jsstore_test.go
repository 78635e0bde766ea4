package jsstore

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/jetstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTranslate(t *testing.T) {
	tests := []struct {
		in   error
		want error
	}{
		{fmt.Errorf("create: %w", jetstream.ErrForbidden), conversation.ErrForbidden},
		{fmt.Errorf("read: %w", jetstream.ErrUnknownRun), conversation.ErrUnknownRun},
		{fmt.Errorf("read: %w", jetstream.ErrInvalidOffset), conversation.ErrInvalidOffset},
		{io.EOF, io.EOF},
	}
	for _, tt := range tests {
		got := translate(tt.in)
		if !errors.Is(got, tt.want) || !errors.Is(got, tt.in) {
			t.Errorf("translate(%v) = %v, want one matching %v and the original", tt.in, got, tt.want)
		}
	}
}
