package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"go.opentelemetry.io/otel/trace"
)

// parseLevel maps --log-level to a slog level.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("want debug, info, warn or error")
}

// isTerminal reports whether w is a character device (an interactive terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newLogger builds the process logger: tint for text (colour only on a terminal), the standard
// JSON handler for json; auto picks text on a terminal and json otherwise.
func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	lvl, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	tty := isTerminal(w)
	if format == "auto" {
		format = "json"
		if tty {
			format = "text"
		}
	}
	switch format {
	case "text":
		return slog.New(traceHandler{tint.NewTextHandler(w, &tint.Options{
			Level:      lvl,
			TimeFormat: time.TimeOnly,
			NoColor:    !tty,
		})}), nil
	case "json":
		return slog.New(traceHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})}), nil
	}
	return nil, fmt.Errorf("log format %q: want auto, text or json", format)
}

// Attribute keys traceHandler adds.
const (
	keyTraceID = "trace_id"
	keySpanID  = "span_id"
)

// traceHandler adds the trace_id and span_id of the span of a record's context, when it has
// one (a turn's log lines, with tracing on), so that a log line leads to its trace.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(keyTraceID, sc.TraceID().String()), slog.String(keySpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
