package conversation_test

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/heartbeat"
)

// BenchmarkIdleSocket measures what one idle conversation socket costs the server: Go heap
// in use plus goroutine stacks (bytes/socket), and the growth of the process's RSS, per
// socket, with b.N sockets open. The clients are raw TCP
// connections that completed the WebSocket handshake and hold no goroutine or buffer, so
// the figure is the server's side (plus a few hundred bytes of client file descriptor).
//
//	go test -run '^$' -bench IdleSocket -benchtime 2000x ./conversation/
func BenchmarkIdleSocket(b *testing.B) { benchmarkIdle(b, false) }

// BenchmarkIdleSocketUsed is BenchmarkIdleSocket with sockets that each read a text frame
// (not JSON, dropped) and a protocol ping from their client after the handshake, and sent
// the pong: a socket idle again after frames should cost the same.
//
//	go test -run '^$' -bench IdleSocketUsed -benchtime 2000x ./conversation/
func BenchmarkIdleSocketUsed(b *testing.B) { benchmarkIdle(b, true) }

// usedFrames are a client's text frame and protocol ping, masked with a zero key, and
// pongFrame the server's answer to the ping.
var (
	usedFrames = []byte{0x81, 0x82, 0, 0, 0, 0, 'h', 'i', 0x89, 0x82, 0, 0, 0, 0, 'h', 'i'}
	pongFrame  = []byte{0x8a, 0x02, 'h', 'i'}
)

// benchmarkIdle opens b.N idle sockets; with used, each reads usedFrames first.
func benchmarkIdle(b *testing.B, used bool) {
	e := newEnv(b, envOptions{heartbeat: heartbeat.Config{Interval: time.Hour, IdleTimeout: time.Hour}, maxSockets: 1 << 30})
	addr := strings.TrimPrefix(e.http.URL, "http://")
	before := memInUse()
	conns := make([]net.Conn, 0, b.N)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatalf("Dial() = %v", err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", addr)
		br := bufio.NewReaderSize(c, 512)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			b.Fatalf("handshake = %v, %v", resp, err)
		}
		if used {
			if _, err := c.Write(usedFrames); err != nil {
				b.Fatalf("frames: %v", err)
			}
			pong := make([]byte, len(pongFrame))
			if _, err := io.ReadFull(br, pong); err != nil || !bytes.Equal(pong, pongFrame) {
				b.Fatalf("pong = %x, %v; want %x", pong, err, pongFrame)
			}
		}
	}
	b.StopTimer()
	deadline := time.Now().Add(10 * time.Second)
	for e.metric(b, "wsgateway_conversation_open_sockets", "conversation") < float64(b.N) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	after := memInUse()
	n := float64(b.N)
	b.ReportMetric(float64(after.heap+after.stack-before.heap-before.stack)/n, "bytes/socket")
	b.ReportMetric(float64(after.heap-before.heap)/n, "heap-bytes/socket")
	b.ReportMetric(float64(after.stack-before.stack)/n, "stack-bytes/socket")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/socket")
	if before.rss > 0 && after.rss > 0 {
		b.ReportMetric(float64(after.rss-before.rss)/n, "rss-bytes/socket")
	}
}

type memUse struct{ heap, stack, goroutines, rss int64 }

// rss returns the process's resident set size from /proc (0 where there is none).
func rss() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// memInUse returns heap and stacks in use after a collection, and the goroutine count.
func memInUse() memUse {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memUse{int64(m.HeapInuse), int64(m.StackInuse), int64(runtime.NumGoroutine()), rss()}
}

// BenchmarkTurnDelivery measures one turn streaming b.N content events as fast as the agent
// can emit them, through the pipeline, the JetStream log and the socket, to a reading client:
// with tracing off (no tracer provider, the default), and on (the OpenTelemetry SDK, its
// spans batched to an exporter that discards them), side by side.
//
//	go test -run '^$' -bench TurnDelivery -benchtime 20000x ./conversation/
func BenchmarkTurnDelivery(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchmarkTurnDelivery(b, nil) })
	b.Run("tracing=on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
		defer tp.Shutdown(context.Background())
		benchmarkTurnDelivery(b, tp)
	})
}

// discardExporter exports spans nowhere.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

func benchmarkTurnDelivery(b *testing.B, tp trace.TracerProvider) {
	e := newEnv(b, envOptions{tracer: tp})
	cl := dial(b, e.url(), "")
	b.ResetTimer()
	cl.send(runFrame("bench", script{Tokens: b.N}))
	got := cl.untilN(b, b.N+5)
	b.StopTimer()
	if !got[len(got)-1].Type.Terminal() {
		b.Fatalf("last frame %s, want the terminal", got[len(got)-1].raw)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
