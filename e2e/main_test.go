// Package e2e tests the gateway as its users run it: the wsgateway binary is built once, started
// as a real process on a loopback port with its embedded NATS server storing in a temporary
// directory, and driven by the real npm clients in Node (testdata/npm) and by Go WebSocket
// clients.
//
// Helpers:
//   - startGateway builds nothing; it starts the binary built by TestMain, waits for /readyz and
//     stops the process (SIGTERM, then kill) when the test ends.
//   - tcpproxy.Start (internal/tcpproxy) puts a loopback TCP proxy between a client and the
//     gateway; Cut resets every connection through it, which is how a test drops a client's
//     socket mid-turn, and SetTarget sends the next connections to another gateway (a load
//     balancer's choice).
//   - runNode runs a script of testdata/npm and returns its NDJSON output; a missing node or
//     testdata/npm/node_modules fails the test with the command that fixes it.
//   - runChat runs the command-line example examples/chat, built on first use.
//
// The package holds only tests.
package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// gatewayBin is the wsgateway binary built by TestMain in binDir; buildErr says why it is
// missing.
var (
	binDir     string
	gatewayBin string
	buildErr   error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wsgateway-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	gatewayBin, buildErr = buildGateway(dir)
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildGateway compiles ./cmd/wsgateway into dir (with the race detector when the tests run
// with it, so the process is checked too) and returns the binary's path.
func buildGateway(dir string) (string, error) {
	return goBuild(dir, "./cmd/wsgateway")
}

// goBuild compiles the main package pkg (a path from the module root) into dir.
func goBuild(dir, pkg string) (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out.Bytes())
	}
	return bin, nil
}
