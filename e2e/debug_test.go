package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// TestDebugAddr starts a gateway with --debug-addr given as a bare port: Go's pprof and the
// runtime metrics answer on 127.0.0.1 at that port (go tool pprof reads the heap profile) and
// not on the main listener. A gateway without the flag listens on its --addr and its embedded
// NATS server only, and its main listener serves no /debug/ path either.
func TestDebugAddr(t *testing.T) {
	port := testenv.FreePort(t)
	on := startGateway(t, "--debug-addr", strconv.Itoa(port))
	off := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	debugAddr := fmt.Sprintf("127.0.0.1:%d", port)
	if recs := on.logRecords("debug listening"); len(recs) != 1 || recs[0]["addr"] != debugAddr {
		t.Errorf("debug listening log records %v, want one with addr %s", recs, debugAddr)
	}
	if got, want := listening(t, on), []string{on.Addr, natsAddr(t, on), debugAddr}; !sameSet(got, want) {
		t.Errorf("with --debug-addr %d the gateway listens on %q, want %q", port, got, want)
	}
	if got, want := listening(t, off), []string{off.Addr, natsAddr(t, off)}; !sameSet(got, want) {
		t.Errorf("without --debug-addr the gateway listens on %q, want %q", got, want)
	}
	if recs := off.logRecords("debug listening"); len(recs) != 0 {
		t.Errorf("without --debug-addr: debug listening logged: %v", recs)
	}

	base := "http://" + debugAddr
	for _, tt := range []struct{ path, want string }{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile: total"},
		{"/debug/pprof/goroutine?debug=1", "github.com/wsgateway/wsgateway/"},
		{"/debug/pprof/heap?debug=1", "heap profile: "},
		{"/debug/metrics", "\n/gc/heap/goal:bytes "},
		{"/debug/metrics", "\n/sched/latencies:seconds count="},
	} {
		status, body, err := httpGet(ctx, base+tt.path)
		if err != nil || status != 200 || !strings.Contains(body, tt.want) {
			t.Errorf("GET %s%s = %d, %v, body with %q: %v\n%.400s", base, tt.path, status, err, tt.want, strings.Contains(body, tt.want), body)
		}
	}
	// The command line is not served: it may hold a NATS password.
	if status, body, err := httpGet(ctx, base+"/debug/pprof/cmdline"); err != nil || status != 404 {
		t.Errorf("GET /debug/pprof/cmdline = %d, %v, want 404\n%.400s", status, err, body)
	}

	// go tool pprof, as an operator runs it, reads the heap profile.
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", base+"/debug/pprof/heap")
	cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "Type: inuse_space") {
		t.Errorf("go tool pprof -top %s/debug/pprof/heap: %v, want a heap profile (Type: inuse_space)\nstdout: %s\nstderr: %s",
			base, err, stdout.String(), stderr.String())
	}

	for _, gw := range []*gateway{on, off} {
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap", "/debug/metrics"} {
			if status, body, err := httpGet(ctx, gw.URL+path); err != nil || status != 404 {
				t.Errorf("GET %s%s on the main listener = %d, %v, want 404\n%.400s", gw.URL, path, status, err, body)
			}
		}
	}
}

// natsAddr returns the host:port of gw's embedded NATS server.
func natsAddr(tb testing.TB, gw *gateway) string {
	tb.Helper()
	u, err := url.Parse(gw.NATSURL)
	if err != nil || u.Host == "" {
		tb.Fatalf("nats_url %q of the start line: %v", gw.NATSURL, err)
	}
	return u.Host
}

// listening returns the TCP addresses (ip:port) on which gw's process holds a listening
// socket: its open socket descriptors matched against the kernel's TCP tables (Linux).
func listening(tb testing.TB, gw *gateway) []string {
	tb.Helper()
	pid := gw.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		tb.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			tb.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" || !inodes[fs[9]] { // 0A: LISTEN
				continue
			}
			addrs = append(addrs, procAddr(tb, fs[1]))
		}
	}
	return addrs
}

// procAddr decodes an address of /proc/net/tcp{,6}: the IP in hex as 32-bit words in host
// (little-endian) order, a colon, the port in hex.
func procAddr(tb testing.TB, s string) string {
	tb.Helper()
	ipHex, portHex, _ := strings.Cut(s, ":")
	ip, err := hex.DecodeString(ipHex)
	port, perr := strconv.ParseUint(portHex, 16, 16)
	if err != nil || perr != nil || len(ip)%4 != 0 {
		tb.Fatalf("address %q of /proc/net/tcp: %v %v", s, err, perr)
	}
	for i := 0; i < len(ip); i += 4 {
		slices.Reverse(ip[i : i+4])
	}
	return net.JoinHostPort(net.IP(ip).String(), strconv.FormatUint(port, 10))
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
