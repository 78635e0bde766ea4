// Package testenv holds what the project's tests share about where they run.
package testenv

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/web"
)

// ModuleRoot returns the directory holding go.mod, found upwards from the working directory
// (a test's working directory is its package's).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// MustModuleRoot is ModuleRoot for a test: it fails tb when there is no module root.
func MustModuleRoot(tb testing.TB) string {
	tb.Helper()
	root, err := ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

// LockedBuffer is a bytes.Buffer safe for a process's output and a test's reads at once.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Listen listens on a loopback TCP port that browsers and fetch accept ([web.Listen]); it
// fails tb when it cannot listen.
func Listen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := web.Listen("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}

// WaitFor polls cond every 10 ms until it holds, and fails tb when it does not within d:
// for what the gateway does in the background (a record, a watch), never a speed figure.
func WaitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	return FreePorts(tb, 1)[0]
}

// FreePorts returns n distinct loopback TCP ports free a moment ago: every listener is held
// until all n are picked, so that no two of them are the same port.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
