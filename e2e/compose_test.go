package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	"go.yaml.in/yaml/v3"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// docker-compose.yml cannot be run here (no Docker engine in CI), so this file keeps it
// consistent with what can be checked: the gateway's flags and their validation (by running
// the gateway binary), deploy/ (the NATS, HAProxy and Prometheus configurations), the
// Dockerfile, and go.mod. The cluster tests run the same topology with processes, started
// with the compose file's gateway flags (composeGatewayFlags).

// composeFile is the part of docker-compose.yml the checks read.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Build           string            `yaml:"build"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	Ports           []string          `yaml:"ports"`
	Expose          []string          `yaml:"expose"`
	Volumes         []string          `yaml:"volumes"`
	DependsOn       yaml.Node         `yaml:"depends_on"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	Healthcheck     *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// dependsOn returns the services s depends on (list or map form).
func (s composeService) dependsOn() []string {
	var out []string
	switch s.DependsOn.Kind {
	case yaml.SequenceNode:
		for _, n := range s.DependsOn.Content {
			out = append(out, n.Value)
		}
	case yaml.MappingNode:
		for i := 0; i < len(s.DependsOn.Content); i += 2 {
			out = append(out, s.DependsOn.Content[i].Value)
		}
	}
	return out
}

// readCompose parses docker-compose.yml at the module root (anchors and merge keys resolved).
func readCompose(tb testing.TB) (composeFile, string) {
	tb.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		tb.Fatal(err)
	}
	var f composeFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(false)
	if err := dec.Decode(&f); err != nil {
		tb.Fatalf("docker-compose.yml: %v", err)
	}
	return f, root
}

// gatewayServices returns the names of the compose services that run the gateway image
// built from the Dockerfile, sorted.
func gatewayServices(f composeFile) []string {
	var out []string
	for name, s := range f.Services {
		if s.Build != "" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// flagArgs returns a gateway service's command line as flags: the command's arguments after
// "serve", then each WSGATEWAY_ variable of its environment as the flag it stands for (so a
// flag given in the command still wins, as in the container).
func flagArgs(s composeService) []string {
	args := slices.Clone(s.Command)
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	var env []string
	for k := range s.Environment {
		env = append(env, k)
	}
	slices.Sort(env)
	var out []string
	for _, k := range env {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "WSGATEWAY_"), "_", "-"))
		out = append(out, "--"+name, s.Environment[k])
	}
	return append(out, args...)
}

// composeGatewayFlags returns the flags docker-compose.yml gives its first gateway service,
// without those naming addresses of the compose network (--addr, --nats-url), for a gateway
// process on loopback.
func composeGatewayFlags(tb testing.TB) []string {
	tb.Helper()
	f, _ := readCompose(tb)
	gws := gatewayServices(f)
	if len(gws) == 0 {
		tb.Fatal("docker-compose.yml: no gateway service (one with build)")
	}
	args := flagArgs(f.Services[gws[0]])
	var out []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--addr", "--nats-url", "--data-dir":
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// gatewayHelp returns the flag names and environment variables `wsgateway serve --help`
// lists.
func gatewayHelp(tb testing.TB) (flags, envs map[string]bool) {
	tb.Helper()
	if buildErr != nil {
		tb.Fatalf("building the gateway: %v", buildErr)
	}
	out, err := exec.Command(gatewayBin, "serve", "--help").Output()
	if err != nil {
		tb.Fatalf("wsgateway serve --help: %v", err)
	}
	flags, envs = map[string]bool{}, map[string]bool{}
	line := regexp.MustCompile(`^  --([a-z-]+) \(default .*; env (WSGATEWAY_[A-Z_]+)\)$`)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]], envs[m[2]] = true, true
		}
	}
	if len(flags) < 10 {
		tb.Fatalf("wsgateway serve --help lists %d flags; its format changed:\n%s", len(flags), out)
	}
	return flags, envs
}

// goModVersions returns the go directive and the required version of module mod in go.mod.
func goModVersions(tb testing.TB, root, mod string) (goVersion, modVersion string) {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		fs := strings.Fields(l)
		switch {
		case len(fs) == 2 && fs[0] == "go":
			goVersion = fs[1]
		case len(fs) >= 2 && fs[0] == mod:
			modVersion = fs[1]
		case len(fs) >= 3 && fs[0] == "require" && fs[1] == mod:
			modVersion = fs[2]
		}
	}
	if goVersion == "" || modVersion == "" {
		tb.Fatalf("go.mod: go directive %q, %s %q", goVersion, mod, modVersion)
	}
	return goVersion, modVersion
}

// TestComposeFile checks docker-compose.yml and the files it uses: a three-node NATS
// JetStream cluster on the nats-server version of go.mod, two or more gateways started with
// flags the gateway accepts (and --replicas 3 on every NATS node), a load balancer whose
// backends and health check are those gateways and /readyz, and Prometheus scraping every
// gateway.
func TestComposeFile(t *testing.T) {
	f, root := readCompose(t)
	flags, envs := gatewayHelp(t)
	_, natsVersion := goModVersions(t, root, "github.com/nats-io/nats-server/v2")

	// The NATS cluster: every node runs deploy/nats/nats.conf under its own name, and the
	// configuration routes to every node.
	var natsNodes []string
	for name, s := range f.Services {
		if strings.HasPrefix(s.Image, "nats:") {
			natsNodes = append(natsNodes, name)
		}
	}
	slices.Sort(natsNodes)
	if len(natsNodes) != 3 {
		t.Fatalf("NATS services %q, want 3", natsNodes)
	}
	cfg := parseNATSConf(t, filepath.Join(root, "deploy", "nats", "nats.conf"))
	clientPort, monitorPort, clusterPort := natsPorts(t, cfg)
	var natsURLs []string
	for _, name := range natsNodes {
		s := f.Services[name]
		if want := "nats:" + strings.TrimPrefix(natsVersion, "v") + "-alpine"; s.Image != want {
			t.Errorf("%s: image %s, want %s (the nats-server of go.mod, which the tests run)", name, s.Image, want)
		}
		conf := mountOf(t, root, name, s, "./deploy/nats/nats.conf")
		if i := slices.Index(s.Command, "--config"); i < 0 || i+1 >= len(s.Command) || s.Command[i+1] != conf {
			t.Errorf("%s: command %q does not load %s", name, s.Command, conf)
		}
		if i := slices.Index(s.Command, "--name"); i < 0 || i+1 >= len(s.Command) || s.Command[i+1] != name {
			t.Errorf("%s: command %q does not name the node %s", name, s.Command, name)
		}
		store := flagValue(s.Command, "--store_dir")
		if store == "" || !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasSuffix(v, ":"+store) && !strings.HasPrefix(v, ".") }) {
			t.Errorf("%s: no named volume on the JetStream store %s (volumes %q)", name, store, s.Volumes)
		}
		if s.Healthcheck == nil || !slices.Contains(s.Healthcheck.Test, fmt.Sprintf("http://127.0.0.1:%d/healthz", monitorPort)) {
			t.Errorf("%s: healthcheck %v, want one on /healthz of the monitoring port %d", name, s.Healthcheck, monitorPort)
		}
		natsURLs = append(natsURLs, fmt.Sprintf("nats://%s:%d", name, clientPort))
	}
	var routes []string
	for _, r := range cfg["cluster"].(map[string]any)["routes"].([]any) {
		routes = append(routes, r.(string))
	}
	var wantRoutes []string
	for _, name := range natsNodes {
		wantRoutes = append(wantRoutes, fmt.Sprintf("nats-route://%s:%d", name, clusterPort))
	}
	if !slices.Equal(routes, wantRoutes) {
		t.Errorf("deploy/nats/nats.conf routes %q, want %q", routes, wantRoutes)
	}

	// The gateways: every flag and variable exists, the command line is valid, and they use
	// every NATS node with three replicas.
	gws := gatewayServices(f)
	if len(gws) < 2 {
		t.Fatalf("gateway services %q, want two or more", gws)
	}
	var gatewayPort string
	for _, name := range gws {
		s := f.Services[name]
		for k := range s.Environment {
			if !envs[k] {
				t.Errorf("%s: environment %s is not a variable of wsgateway serve", name, k)
			}
		}
		args := flagArgs(s)
		for _, a := range args {
			if n, ok := strings.CutPrefix(a, "--"); ok && !flags[n] {
				t.Errorf("%s: flag %s is not a flag of wsgateway serve", name, a)
			}
		}
		if got := flagValue(args, "--nats-url"); got != strings.Join(natsURLs, ",") {
			t.Errorf("%s: --nats-url %q, want every NATS node %q", name, got, strings.Join(natsURLs, ","))
		}
		if got := flagValue(args, "--replicas"); got != "3" {
			t.Errorf("%s: --replicas %q, want 3", name, got)
		}
		addr := flagValue(args, "--addr")
		port := addr[strings.LastIndex(addr, ":")+1:]
		if !strings.HasPrefix(addr, "0.0.0.0:") || !slices.Contains(s.Expose, port) {
			t.Errorf("%s: --addr %q, want 0.0.0.0:<an exposed port> (expose %q)", name, addr, s.Expose)
		}
		if gatewayPort != "" && port != gatewayPort {
			t.Errorf("%s listens on %s, the other gateways on %s", name, port, gatewayPort)
		}
		gatewayPort = port
		for _, n := range natsNodes {
			if !slices.Contains(s.dependsOn(), n) {
				t.Errorf("%s does not depend on %s", name, n)
			}
		}
		grace, err := time.ParseDuration(s.StopGracePeriod)
		drain, derr := time.ParseDuration(flagValue(args, "--drain-timeout"))
		if err != nil || derr != nil || grace < drain+10*time.Second {
			t.Errorf("%s: stop_grace_period %q, want at least the drain timeout (%q) plus 10s", name, s.StopGracePeriod, flagValue(args, "--drain-timeout"))
		}
		checkGatewayCommandLine(t, name, args)
	}

	// The load balancer and Prometheus reach every gateway.
	var wantTargets []string
	for _, name := range gws {
		wantTargets = append(wantTargets, name+":"+gatewayPort)
	}
	var lbs, proms []string
	for name, s := range f.Services {
		switch {
		case strings.HasPrefix(s.Image, "haproxy:"):
			lbs = append(lbs, name)
			checkHAProxy(t, root, name, s, wantTargets)
		case strings.HasPrefix(s.Image, "prom/prometheus:"):
			proms = append(proms, name)
			checkPrometheus(t, root, name, s, wantTargets)
		}
		for _, d := range s.dependsOn() {
			if _, ok := f.Services[d]; !ok {
				t.Errorf("%s depends on %s, which is no service", name, d)
			}
		}
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if _, ok := f.Volumes[src]; !ok && !strings.HasPrefix(src, ".") {
				t.Errorf("%s: volume %s is neither declared nor a path", name, src)
			}
		}
	}
	if len(lbs) != 1 || len(proms) != 1 {
		t.Errorf("load balancers %q and Prometheus services %q, want one of each", lbs, proms)
	}
	checkDockerfile(t, root, envs)
}

// flagValue returns the value of the last occurrence of flag in args ("" if absent).
func flagValue(args []string, flag string) string {
	v := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			v = args[i+1]
		}
	}
	return v
}

// checkGatewayCommandLine runs the gateway binary with a compose service's flags, its NATS
// URLs replaced by an unreachable loopback one: a valid command line gets as far as
// connecting to NATS (exit 1), an invalid one stops at once (exit 2).
func checkGatewayCommandLine(tb testing.TB, service string, args []string) {
	tb.Helper()
	args = append(slices.Clone(args), "--addr", "127.0.0.1:0", "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", testenv.FreePort(tb)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBin, append([]string{"serve"}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "open the run log") {
		tb.Errorf("%s: wsgateway serve %q with an unreachable NATS: %v, want exit status 1 failing to open the run log\n%s", service, args, err, stderr.String())
	}
}

// parseNATSConf parses a nats-server configuration file as nats-server does, and checks that
// nats-server accepts it.
func parseNATSConf(tb testing.TB, path string) map[string]any {
	tb.Helper()
	cfg, err := conf.ParseFile(path)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	out, err := exec.Command(natsServerBinary(tb), "-t", "-c", path).CombinedOutput()
	if err != nil {
		tb.Fatalf("nats-server -t -c %s: %v\n%s", path, err, out)
	}
	return cfg
}

// natsPorts returns the client, monitoring and cluster ports of a nats.conf.
func natsPorts(tb testing.TB, cfg map[string]any) (client, monitor, cluster int) {
	tb.Helper()
	cl, _ := cfg["cluster"].(map[string]any)
	listen, _ := cl["listen"].(string)
	if i := strings.LastIndex(listen, ":"); i >= 0 {
		fmt.Sscan(listen[i+1:], &cluster)
	}
	c, _ := cfg["port"].(int64)
	m, _ := cfg["http_port"].(int64)
	client, monitor = int(c), int(m)
	if client == 0 || monitor == 0 || cluster == 0 || cl["name"] == nil {
		tb.Fatalf("nats.conf: port %v, http_port %v, cluster %v: want all three ports and a cluster name", cfg["port"], cfg["http_port"], cl)
	}
	js, _ := cfg["jetstream"].(map[string]any)
	limits, _ := js["limits"].(map[string]any)
	if limits == nil || limits["default_max_consumers"] != int64(-1) {
		tb.Fatalf("nats.conf: jetstream %v, want it enabled without a cap on a stream's consumers (one per resume socket)", cfg["jetstream"])
	}
	return client, monitor, cluster
}

// mountOf returns where service s mounts the file src (a path from the module root, as
// written in the compose file), failing the test when it does not or the file is missing.
func mountOf(tb testing.TB, root, service string, s composeService, src string) string {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(src))); err != nil {
		tb.Errorf("%s: %v", service, err)
	}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[0] == src {
			return parts[1]
		}
	}
	tb.Errorf("%s: %s is not mounted (volumes %q)", service, src, s.Volumes)
	return ""
}

// checkHAProxy checks the load balancer: its configuration is mounted, its frontend port is
// published, its backends are exactly the gateways, and it checks their /readyz.
func checkHAProxy(tb testing.TB, root, name string, s composeService, targets []string) {
	tb.Helper()
	if mountOf(tb, root, name, s, "./deploy/haproxy/haproxy.cfg") != "/usr/local/etc/haproxy/haproxy.cfg" {
		tb.Errorf("%s: haproxy.cfg not mounted where the image reads it", name)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "haproxy", "haproxy.cfg"))
	if err != nil {
		tb.Fatal(err)
	}
	var servers, binds []string
	healthCheck, tunnel := false, false
	for _, l := range strings.Split(string(b), "\n") {
		fs := strings.Fields(l)
		switch {
		case len(fs) >= 3 && fs[0] == "server":
			servers = append(servers, fs[2])
		case len(fs) >= 2 && fs[0] == "bind":
			binds = append(binds, fs[1])
		case strings.Join(fs, " ") == "option httpchk GET /readyz":
			healthCheck = true
		case len(fs) == 3 && fs[0] == "timeout" && fs[1] == "tunnel":
			tunnel = true
		}
	}
	if !slices.Equal(servers, targets) {
		tb.Errorf("haproxy.cfg servers %q, want the gateways %q", servers, targets)
	}
	if !healthCheck || !tunnel {
		tb.Errorf("haproxy.cfg: health check on /readyz %v, WebSocket tunnel timeout %v; want both", healthCheck, tunnel)
	}
	for _, b := range binds {
		port := b[strings.LastIndex(b, ":")+1:]
		if !slices.ContainsFunc(s.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) }) {
			tb.Errorf("%s: frontend port %s is not published (ports %q)", name, port, s.Ports)
		}
	}
}

// checkPrometheus checks that Prometheus scrapes /metrics of exactly the gateways.
func checkPrometheus(tb testing.TB, root, name string, s composeService, targets []string) {
	tb.Helper()
	if mountOf(tb, root, name, s, "./deploy/prometheus/prometheus.yml") != "/etc/prometheus/prometheus.yml" {
		tb.Errorf("%s: prometheus.yml not mounted where the image reads it", name)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		tb.Fatal(err)
	}
	var p struct {
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &p); err != nil {
		tb.Fatalf("prometheus.yml: %v", err)
	}
	var got []string
	for _, sc := range p.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			tb.Errorf("prometheus.yml: metrics_path %q, want /metrics", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			got = append(got, st.Targets...)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, targets) {
		tb.Errorf("prometheus.yml targets %q, want the gateways %q", got, targets)
	}
}

// checkDockerfile checks the image: built with the Go of go.mod, run as a non-root user,
// and configured only through variables the gateway knows.
func checkDockerfile(tb testing.TB, root string, envs map[string]bool) {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		tb.Fatal(err)
	}
	goVersion, _ := goModVersions(tb, root, "github.com/nats-io/nats-server/v2")
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var user, goImage string
	stages := 0
	for _, l := range strings.Split(text, "\n") {
		fs := strings.Fields(l)
		if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		switch fs[0] {
		case "FROM":
			stages++
			user = "" // USER applies to the stage it is in
			if strings.HasPrefix(fs[1], "golang:") {
				goImage = fs[1]
			}
		case "USER":
			user = fs[1]
		case "ENV":
			for _, kv := range fs[1:] {
				k, _, _ := strings.Cut(kv, "=")
				if !envs[k] {
					tb.Errorf("Dockerfile: ENV %s is not a variable of wsgateway serve", k)
				}
			}
		}
	}
	if want := "golang:" + goVersion; !strings.HasPrefix(goImage, want) {
		tb.Errorf("Dockerfile builds with %s, want %s (go.mod)", goImage, want)
	}
	if stages < 2 {
		tb.Errorf("Dockerfile has %d stages, want a build stage and a small final one", stages)
	}
	if uid, _, _ := strings.Cut(user, ":"); user == "" || uid == "0" || uid == "root" {
		tb.Errorf("Dockerfile: final stage runs as %q, want a non-root user", user)
	}
}
