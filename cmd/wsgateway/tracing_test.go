package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestTracingWanted(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    bool
		wantErr bool
	}{
		{env: nil, want: false},
		{env: map[string]string{envEndpoint: "http://127.0.0.1:4318"}, want: true},
		{env: map[string]string{envTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, want: true},
		{env: map[string]string{envTracesExporter: "otlp"}, want: true},
		{env: map[string]string{envTracesExporter: "none", envEndpoint: "http://x:4318"}, want: false},
		{env: map[string]string{envSDKDisabled: "true", envEndpoint: "http://x:4318"}, want: false},
		{env: map[string]string{envTracesExporter: "zipkin"}, wantErr: true},
		{env: map[string]string{envEndpoint: "http://x:4317", envProtocol: "grpc"}, wantErr: true},
		{env: map[string]string{envEndpoint: "http://x:4318", envProtocol: "grpc", envTracesProtocol: "http/protobuf"}, want: true},
	} {
		got, err := tracingWanted(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
		if got != tc.want || (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, errUsage)) {
			t.Errorf("tracingWanted(%v) = %v, %v; want %v, error %v", tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestLogTraceIDs checks that a log line written with a context holding a span carries its
// trace_id and span_id, and one without none.
func TestLogTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger("json", "info", &buf)
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.With("runId", "r1").InfoContext(ctx, "traced")
	log.Info("untraced")
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	var traced, untraced map[string]any
	if len(lines) != 2 || json.Unmarshal(lines[0], &traced) != nil || json.Unmarshal(lines[1], &untraced) != nil {
		t.Fatalf("log = %s", buf.Bytes())
	}
	if traced["trace_id"] != tid.String() || traced["span_id"] != sid.String() || traced["runId"] != "r1" {
		t.Errorf("traced line %s, want trace_id %s, span_id %s and runId r1", lines[0], tid, sid)
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("untraced line %s carries a trace_id", lines[1])
	}
}
