package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// The Grafana dashboard and the Prometheus alert rules under deploy/ name metrics and label
// values; TestDashboardMetrics keeps them from rotting: every name and label value they use
// must be on /metrics of a real gateway after a turn and a resume.

// Files of the dashboard and the rules, from the module root.
const (
	dashboardFile  = "deploy/grafana/dashboards/wsgateway.json"
	datasourceFile = "deploy/grafana/provisioning/datasources/prometheus.yml"
	providerFile   = "deploy/grafana/provisioning/dashboards/wsgateway.yml"
	alertsFile     = "deploy/prometheus/alerts.yml"
)

// dashboardMetrics are the metrics the dashboard must show (the list: sockets, turns
// by outcome, events/s, append latency, resumes, reaps, limit refusals, NATS readiness).
var dashboardMetrics = []string{
	"wsgateway_conversation_open_sockets",
	"wsgateway_turn_ended_total",
	"wsgateway_turn_events_appended_total",
	"wsgateway_turn_append_duration_seconds_bucket",
	"wsgateway_conversation_resumes_total",
	"wsgateway_jetstream_runs_reaped_total",
	"wsgateway_conversation_limit_refusals_total",
	"wsgateway_jetstream_ready",
	"wsgateway_agent_time_to_first_token_seconds_bucket",
	"wsgateway_agent_inter_token_seconds_bucket",
	"wsgateway_agent_tokens_per_second_bucket",
	"wsgateway_agent_turn_duration_seconds_bucket",
	"wsgateway_agent_tokens_total",
}

// series is what /metrics exposes: metric name → label name → values seen.
type series map[string]map[string]map[string]bool

// scrape reads the text exposition of url.
func scrape(tb testing.TB, ctx context.Context, url string) series {
	tb.Helper()
	status, body, err := httpGet(ctx, url)
	if err != nil || status != 200 {
		tb.Fatalf("GET %s = %d, %v", url, status, err)
	}
	out := series{}
	line := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	pair := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := out[m[1]]
		if labels == nil {
			labels = map[string]map[string]bool{}
			out[m[1]] = labels
		}
		for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
			if labels[p[1]] == nil {
				labels[p[1]] = map[string]bool{}
			}
			labels[p[1]][p[2]] = true
		}
	}
	return out
}

// dashboardExprs returns the PromQL expressions of the dashboard's panels, by panel title, and
// checks that every panel queries the provisioned data source.
func dashboardExprs(tb testing.TB, root string) map[string][]string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(root, dashboardFile))
	if err != nil {
		tb.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		tb.Fatalf("%s: %v", dashboardFile, err)
	}
	ds := readYAML[struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}](tb, root, datasourceFile)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		tb.Fatalf("%s: data sources %+v, want the compose file's Prometheus", datasourceFile, ds.Datasources)
	}
	out := map[string][]string{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != ds.Datasources[0].UID {
			tb.Errorf("%s: panel %q queries data source %q, want the provisioned %q", dashboardFile, p.Title, p.Datasource.UID, ds.Datasources[0].UID)
		}
		if len(p.Targets) == 0 {
			tb.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, t := range p.Targets {
			out["panel "+p.Title] = append(out["panel "+p.Title], t.Expr)
		}
	}
	return out
}

// ruleExprs returns the expressions of the alert rules, by alert name.
func ruleExprs(tb testing.TB, root string) map[string][]string {
	tb.Helper()
	rules := readYAML[struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}](tb, root, alertsFile)
	out := map[string][]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				tb.Errorf("%s: rule %+v without alert name or expression", alertsFile, r)
			}
			out["alert "+r.Alert] = append(out["alert "+r.Alert], r.Expr)
		}
	}
	if len(out) == 0 {
		tb.Fatalf("%s: no alert rule", alertsFile)
	}
	return out
}

func readYAML[T any](tb testing.TB, root, file string) T {
	tb.Helper()
	var v T
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		tb.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		tb.Fatalf("%s: %v", file, err)
	}
	return v
}

var (
	// metricName matches the names of the gateway's metrics and of its Go and process
	// collectors in an expression; "up" is Prometheus's own.
	metricName = regexp.MustCompile(`\b(?:wsgateway|go|process)_[a-zA-Z0-9_:]+`)
	// selector matches a metric with label matchers.
	selector = regexp.MustCompile(`\b((?:wsgateway|go|process)_[a-zA-Z0-9_:]+)\s*\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"\s*$`)
)

// checkExpr reports the metric names and label values of expr that the scrape lacks. The
// labels Prometheus adds (job, instance) are not the gateway's.
func checkExpr(expr string, have series) []string {
	var missing []string
	for _, name := range metricName.FindAllString(expr, -1) {
		if have[name] == nil {
			missing = append(missing, "metric "+name)
		}
	}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		for _, part := range strings.Split(m[2], ",") {
			mm := matcher.FindStringSubmatch(part)
			if mm == nil {
				missing = append(missing, "unparsed matcher "+part)
				continue
			}
			label, op, value := mm[1], mm[2], mm[3]
			if label == "job" || label == "instance" || op == "!=" || op == "!~" {
				continue
			}
			values := []string{value}
			if op == "=~" {
				values = strings.Split(value, "|")
			}
			for _, v := range values {
				if !have[m[1]][label][v] {
					missing = append(missing, m[1]+"{"+label+`="`+v+`"}`)
				}
			}
		}
	}
	return missing
}

// balanced reports whether the brackets of expr pair up.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inString := false
	for _, r := range expr {
		switch {
		case r == '"':
			inString = !inString
		case inString:
		case r == '(' || r == '[' || r == '{':
			stack = append(stack, r)
		case pairs[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}

// TestDashboardMetrics runs a turn and a resume on a real gateway, then checks every metric
// name and label value of the dashboard's panels and of the alert rules against its /metrics,
// and that the dashboard covers the metrics operators need.
func TestDashboardMetrics(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dialTurn(t, ctx, gw, "dash-run", `{"tokens":3,"intervalMs":0}`)
	if events := readUntilTerminal(t, ctx, c); eventTypes(events[len(events)-1:]) != "RUN_FINISHED" {
		t.Fatalf("the turn ended %q, want RUN_FINISHED", eventTypes(events))
	}
	if events := joinLog(t, ctx, gw, "dash-run"); !strings.HasSuffix(eventTypes(events), "RUN_FINISHED") {
		t.Fatalf("the joined log ends %q, want RUN_FINISHED", eventTypes(events))
	}
	have := scrape(t, ctx, gw.URL+"/metrics")

	exprs := dashboardExprs(t, root)
	var used []string
	for where, es := range exprs {
		for _, e := range es {
			used = append(used, metricName.FindAllString(e, -1)...)
			if !balanced(e) {
				t.Errorf("%s: %s: unbalanced brackets in %q", dashboardFile, where, e)
			}
			for _, m := range checkExpr(e, have) {
				t.Errorf("%s: %s uses %s, which the gateway's /metrics lacks", dashboardFile, where, m)
			}
		}
	}
	for _, m := range dashboardMetrics {
		if !slices.Contains(used, m) {
			t.Errorf("%s: no panel shows %s", dashboardFile, m)
		}
	}
	n := 0
	for where, es := range ruleExprs(t, root) {
		for _, e := range es {
			n++
			if !balanced(e) {
				t.Errorf("%s: %s: unbalanced brackets in %q", alertsFile, where, e)
			}
			for _, m := range checkExpr(e, have) {
				t.Errorf("%s: %s uses %s, which the gateway's /metrics lacks", alertsFile, where, m)
			}
		}
	}
	t.Logf("%d dashboard panels and %d alert rules checked against %d metric names", len(exprs), n, len(have))
	if v := gatewayMetric(t, ctx, gw, "wsgateway_jetstream_ready"); v != 1 {
		t.Errorf("wsgateway_jetstream_ready = %v on a ready gateway, want 1", v)
	}
}

// gatewayMetric returns the sum of a metric's samples on gw's /metrics.
func gatewayMetric(tb testing.TB, ctx context.Context, gw *gateway, name string) float64 {
	tb.Helper()
	return (&secGateway{gateway: gw}).metricValue(tb, ctx, name)
}

// TestDashboardProvisioning checks that docker-compose.yml provisions Grafana with the
// dashboard and its data source, and that Prometheus loads the alert rules.
func TestDashboardProvisioning(t *testing.T) {
	f, root := readCompose(t)
	var grafana []string
	for name, s := range f.Services {
		switch {
		case strings.HasPrefix(s.Image, "grafana/grafana:"):
			grafana = append(grafana, name)
			if got := mountOf(t, root, name, s, "./deploy/grafana/provisioning"); got != "/etc/grafana/provisioning" {
				t.Errorf("%s: provisioning mounted at %q, want /etc/grafana/provisioning", name, got)
			}
			dir := mountOf(t, root, name, s, "./deploy/grafana/dashboards")
			provider := readYAML[struct {
				Providers []struct {
					Options struct {
						Path string `yaml:"path"`
					} `yaml:"options"`
				} `yaml:"providers"`
			}](t, root, providerFile)
			if len(provider.Providers) != 1 || provider.Providers[0].Options.Path != dir {
				t.Errorf("%s: providers %+v, want one reading %s (where the dashboards are mounted)", providerFile, provider.Providers, dir)
			}
			if !slices.Contains(s.dependsOn(), "prometheus") {
				t.Errorf("%s does not depend on prometheus", name)
			}
		case strings.HasPrefix(s.Image, "prom/prometheus:"):
			rules := mountOf(t, root, name, s, "./deploy/prometheus/alerts.yml")
			p := readYAML[struct {
				RuleFiles []string `yaml:"rule_files"`
			}](t, root, "deploy/prometheus/prometheus.yml")
			if !slices.Contains(p.RuleFiles, rules) {
				t.Errorf("prometheus.yml rule_files %q, want %s (where alerts.yml is mounted)", p.RuleFiles, rules)
			}
		}
	}
	if len(grafana) != 1 {
		t.Errorf("Grafana services %q, want one", grafana)
	}
}
