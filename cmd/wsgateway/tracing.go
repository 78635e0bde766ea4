package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// serviceName is the service.name of the gateway's spans unless OTEL_SERVICE_NAME (or
// OTEL_RESOURCE_ATTRIBUTES) names another.
const serviceName = "wsgateway"

// tracingFlushTimeout bounds the export of the spans still buffered at exit.
const tracingFlushTimeout = 5 * time.Second

// Environment variables of the OpenTelemetry specification that decide whether the gateway
// traces (docs/CONFIGURATION.md, "Tracing"); the exporter and the SDK read the others themselves
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_TRACES_SAMPLER, OTEL_BSP_*, …).
const (
	envSDKDisabled    = "OTEL_SDK_DISABLED"
	envTracesExporter = "OTEL_TRACES_EXPORTER"
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// tracingWanted reports whether the OTEL_* environment asks for traces: OTEL_TRACES_EXPORTER
// otlp, or unset with an OTLP endpoint set; never with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. An exporter or protocol the gateway does not have is an error.
func tracingWanted(lookup func(string) (string, bool)) (bool, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get(envSDKDisabled), "true") {
		return false, nil
	}
	on := get(envEndpoint) != "" || get(envTracesEndpoint) != ""
	if v := get(envTracesExporter); v != "" {
		on = false
		for _, e := range strings.Split(v, ",") {
			switch e = strings.TrimSpace(e); e {
			case "otlp":
				on = true
			case "none":
				return false, nil
			default:
				return false, fmt.Errorf("%w: %s=%q: the gateway exports traces with otlp (or none)", errUsage, envTracesExporter, v)
			}
		}
	}
	if !on {
		return false, nil
	}
	for _, k := range []string{envTracesProtocol, envProtocol} {
		if p := get(k); p != "" {
			if p != "http/protobuf" {
				return false, fmt.Errorf("%w: %s=%q: the gateway exports OTLP over http/protobuf only", errUsage, k, p)
			}
			break // the traces' own setting wins
		}
	}
	return true, nil
}

// newTracerProvider returns the tracer provider of the OTEL_* environment: spans batched
// to an OTLP/HTTP exporter, with the resource service.name wsgateway, or nil when tracing is
// off, which starts nothing. The SDK's errors (a failed export) are logged as warnings.
func newTracerProvider(ctx context.Context, lookup func(string) (string, bool), log *slog.Logger) (*sdktrace.TracerProvider, error) {
	on, err := tracingWanted(lookup)
	if err != nil || !on {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing", slog.String(keyErr, err.Error()))
	}))
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// flushTracing exports the spans still buffered and stops tp, within tracingFlushTimeout.
func flushTracing(tp *sdktrace.TracerProvider, log *slog.Logger) {
	if tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing the last spans", slog.String(keyErr, err.Error()))
	}
}
