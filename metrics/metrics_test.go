package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNames(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.SocketOpened(TransportSSE, SocketConversation)
	m.SocketOpened(TransportSSE, SocketConversation)
	m.SocketClosed(TransportSSE, SocketConversation)
	m.TurnStarted()
	m.TurnEnded(OutcomeAborted)
	m.EventAppended(3 * time.Millisecond)
	m.Delivered(time.Millisecond)
	m.Resume(TransportWebSocket, ResumeUnknownRun)
	m.FrameDropped(DropNotJSON)
	m.LimitRefused(LimitRunFrameRate)
	m.RunReaped()
	m.LivenessRenewed()
	ready := true
	m.SetReadyCheck(func() bool { return ready })

	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "wsgateway_") {
			t.Errorf("metric %s lacks the wsgateway_ prefix", name)
		}
		if f.GetType().String() == "COUNTER" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if f.GetType().String() == "HISTOGRAM" && !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_per_second") {
			t.Errorf("histogram %s does not end in _seconds or _per_second", name)
		}
	}
	tests := []struct {
		name, label string
		want        float64
	}{
		{"wsgateway_conversation_open_sockets", "conversation,sse", 1},
		{"wsgateway_conversation_open_sockets", "conversation,websocket", 0},
		{"wsgateway_conversation_open_sockets", "resume,sse", 0},
		{"wsgateway_turn_started_total", "", 1},
		{"wsgateway_turn_ended_total", "aborted", 1},
		{"wsgateway_turn_ended_total", "completed", 0},
		{"wsgateway_turn_events_appended_total", "", 1},
		{"wsgateway_turn_append_duration_seconds", "", 1},
		{"wsgateway_turn_delivery_duration_seconds", "", 1},
		{"wsgateway_conversation_resumes_total", "unknown_run,websocket", 1},
		{"wsgateway_conversation_resumes_total", "unknown_run,ndjson", 0},
		{"wsgateway_conversation_frames_dropped_total", "not_json", 1},
		{"wsgateway_conversation_frames_dropped_total", "binary", 0},
		{"wsgateway_conversation_limit_refusals_total", "run_frame_rate", 1},
		{"wsgateway_conversation_limit_refusals_total", "max_socket_turns", 0},
		{"wsgateway_conversation_limit_refusals_total", "max_principal_sockets", 0},
		{"wsgateway_jetstream_runs_reaped_total", "", 1},
		{"wsgateway_jetstream_liveness_renewals_total", "", 1},
		{"wsgateway_jetstream_ready", "", 1},
	}
	for _, tt := range tests {
		if got := value(t, families, tt.name, tt.label); got != tt.want {
			t.Errorf("%s{%s} = %v, want %v", tt.name, tt.label, got, tt.want)
		}
	}
	ready = false
	if families, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if got := value(t, families, "wsgateway_jetstream_ready", ""); got != 0 {
		t.Errorf("wsgateway_jetstream_ready = %v once the check fails, want 0", got)
	}
}

// value returns the value of the series of family name whose label values, joined with
// commas in the order of the label names, are labels (or the unlabelled series); for a
// histogram, its sample count.
func value(t testing.TB, families []*dto.MetricFamily, name, labels string) float64 {
	t.Helper()
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			var values []string
			for _, l := range s.GetLabel() {
				values = append(values, l.GetValue())
			}
			if strings.Join(values, ",") != labels {
				continue
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s{%s}", name, labels)
	return 0
}

func TestNilRecordsNothing(t *testing.T) {
	var m *Metrics
	m.SocketOpened(TransportWebSocket, SocketResume)
	m.TurnEnded(OutcomeCompleted)
	m.EventAppended(time.Second)
	m.Delivered(time.Second)
	m.Resume(TransportNDJSON, ResumeCompleted)
	m.FrameDropped(DropBinary)
	m.RunReaped()
	m.LimitRefused(LimitSocketTurns)
	m.SetReadyCheck(func() bool { return true })
	m.TurnStarted()
	m.SocketClosed(TransportWebSocket, SocketResume)
}
