package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// A network lab: the test's own hosts, each in a network namespace of its own, linked by a
// veth pair to one bridge in a switch namespace; the test process reaches them through a veth
// pair of its own (address .1 of the lab's subnet). The addresses come from one /24 of
// 198.18.0.0/15 (set aside for network tests) that no interface of the machine has, and exist
// only on the lab's links: no host has a route out. Faults are made where a network makes
// them, in the switch: nftables rules of the bridge's forward hook drop what passes from one
// host to another (a partition, one way or both) or a share of a link's packets at random,
// so that neither end's stack knows; the hosts' TCP sees only silence and retransmits.
//
// Every namespace and link is removed when the test ends, also when it fails; a lab left by a
// test binary that was killed is removed by the next one (its namespaces name its pid).
// A lab needs root, ip (iproute2) and nft (nftables); scripts/test installs both.

// netLab is one lab.
type netLab struct {
	tb     testing.TB
	prefix string // "wsgt<pid>x<k>": of every namespace, and of the test process's link
	sw     string // the switch namespace
	net    string // the subnet's first three octets, "198.18.N"
	hosts  []*netHost
}

// netHost is one host of a lab.
type netHost struct {
	Name string // short: it names the host's link in the switch ("v-" + Name)
	NS   string // its network namespace
	Addr string // its IPv4 address
}

var (
	labNS   = regexp.MustCompile(`^(wsgt(\d+)x\d+)-`)
	labs    atomic.Int32 // labs made by this test binary
	labMake sync.Mutex   // held while a lab picks its subnet and takes it
)

// needLab fails the test where a lab cannot be made: in CI (where scripts/test installs
// what it needs, as root) and wherever the test was asked for by name; it skips it on a
// developer's machine that is not root.
func needLab(tb testing.TB) {
	tb.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("network namespaces need %s (scripts/test installs iproute2 and nftables as root)", strings.Join(missing, ", "))
	}
	tb.Skipf("network namespaces need %s; run as root with iproute2 and nftables", strings.Join(missing, ", "))
}

// newNetLab makes a lab with hosts of the given names (addresses .10, .11, ... in order) and
// removes it when the test ends.
func newNetLab(tb testing.TB, names ...string) *netLab {
	tb.Helper()
	needLab(tb)
	labMake.Lock()
	defer labMake.Unlock()
	sweepLabs(tb)
	l := &netLab{tb: tb, prefix: fmt.Sprintf("wsgt%dx%d", os.Getpid(), labs.Add(1))}
	l.sw = l.prefix + "-sw"
	l.net = l.freeSubnet()
	tb.Cleanup(l.remove)
	l.ip("netns", "add", l.sw)
	l.ip("-n", l.sw, "link", "set", "lo", "up")
	l.ip("-n", l.sw, "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.sw, "link", "set", "br0", "up")
	l.nft(l.sw, "add", "table", "bridge", "lab")
	l.nft(l.sw, "add", "chain", "bridge", "lab", "links", "{ type filter hook forward priority 0; policy accept; }")
	// The test process's own end, .1.
	l.ip("link", "add", l.prefix, "type", "veth", "peer", "name", "v-test", "netns", l.sw)
	l.ip("-n", l.sw, "link", "set", "v-test", "master", "br0", "up")
	l.ip("addr", "add", l.net+".1/24", "dev", l.prefix)
	l.ip("link", "set", l.prefix, "up")
	for i, name := range names {
		h := &netHost{Name: name, NS: l.prefix + "-" + name, Addr: fmt.Sprintf("%s.%d", l.net, 10+i)}
		l.ip("netns", "add", h.NS)
		l.hosts = append(l.hosts, h)
		l.ip("-n", h.NS, "link", "set", "lo", "up")
		l.ip("-n", l.sw, "link", "add", "v-"+name, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
		l.ip("-n", l.sw, "link", "set", "v-"+name, "master", "br0", "up")
		l.ip("-n", h.NS, "addr", "add", h.Addr+"/24", "dev", "eth0")
		l.ip("-n", h.NS, "link", "set", "eth0", "up")
	}
	return l
}

// host returns the host named name.
func (l *netLab) host(name string) *netHost {
	for _, h := range l.hosts {
		if h.Name == name {
			return h
		}
	}
	l.tb.Fatalf("no lab host %q", name)
	return nil
}

// command returns a command that runs bin with args in h's namespace.
func (h *netHost) command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, bin}, args...)...)
}

// cut drops every packet from each host of from to each host of to, in the switch: one way.
// A partition is two cuts.
func (l *netLab) cut(from, to []*netHost) {
	l.tb.Helper()
	l.nft(l.sw, "add", "rule", "bridge", "lab", "links", "ip", "saddr", addrSet(from), "ip", "daddr", addrSet(to), "drop")
}

// partition cuts a from b both ways.
func (l *netLab) partition(a, b []*netHost) {
	l.tb.Helper()
	l.cut(a, b)
	l.cut(b, a)
}

// lose drops percent of the packets h sends and percent of those it receives, at random.
func (l *netLab) lose(h *netHost, percent int) {
	l.tb.Helper()
	p := strconv.Itoa(percent)
	l.nft(l.sw, "add", "rule", "bridge", "lab", "links", "iifname", "v-"+h.Name, "numgen", "random", "mod", "100", "<", p, "drop")
	l.nft(l.sw, "add", "rule", "bridge", "lab", "links", "oifname", "v-"+h.Name, "numgen", "random", "mod", "100", "<", p, "drop")
}

// heal removes every fault.
func (l *netLab) heal() {
	l.tb.Helper()
	l.nft(l.sw, "flush", "chain", "bridge", "lab", "links")
}

func addrSet(hs []*netHost) string {
	addrs := make([]string, len(hs))
	for i, h := range hs {
		addrs[i] = h.Addr
	}
	return "{ " + strings.Join(addrs, ", ") + " }"
}

// remove deletes the lab's namespaces (with them their links, the test process's end too).
func (l *netLab) remove() {
	for _, h := range l.hosts {
		if out, err := exec.Command("ip", "netns", "del", h.NS).CombinedOutput(); err != nil {
			l.tb.Errorf("ip netns del %s: %v: %s", h.NS, err, out)
		}
	}
	exec.Command("ip", "netns", "del", l.sw).Run() // may not exist yet
	exec.Command("ip", "link", "del", l.prefix).Run()
}

// freeSubnet returns the first 198.18.N.0/24 (N from 10 + pid mod 200) that no interface has.
func (l *netLab) freeSubnet() string {
	l.tb.Helper()
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	if err != nil {
		l.tb.Fatalf("ip addr show: %v", err)
	}
	for i := range 200 {
		n := fmt.Sprintf("198.18.%d", 10+(os.Getpid()+i)%200)
		if !bytes.Contains(out, []byte(" "+n+".")) {
			return n
		}
	}
	l.tb.Fatal("no free /24 in 198.18.10.0 to 198.18.209.0")
	return ""
}

// sweepLabs removes the namespaces of labs whose test binary is gone.
func sweepLabs(tb testing.TB) {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		tb.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		m := labNS.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		if pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		tb.Logf("removing namespace %s of a test binary that is gone", name)
		exec.Command("ip", "netns", "del", name).Run()
		exec.Command("ip", "link", "del", m[1]).Run()
	}
}

func (l *netLab) ip(args ...string) {
	l.tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *netLab) nft(ns string, args ...string) {
	l.tb.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput(); err != nil {
		l.tb.Fatalf("nft %s (in %s): %v: %s", strings.Join(args, " "), ns, err, out)
	}
}
