package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// rawReport is the result of a raw baseline.
type rawReport struct {
	Baseline   string  `json:"baseline"`
	Messages   int64   `json:"messages"`
	Bytes      int     `json:"bytesPerMessage"`
	Seconds    float64 `json:"seconds"`
	PerSec     float64 `json:"messagesPerSec"`
	Publishers int     `json:"publishers,omitempty"`
	Conns      int     `json:"conns,omitempty"`
	// Rate and Latency: a paced run (raw-jetstream --rate), its target rate and the
	// publish → acknowledgement latencies of its synchronous publishes.
	Rate    float64      `json:"rate,omitempty"`
	Latency *percentiles `json:"latencyMs,omitempty"`
}

func (r *rawReport) write(w io.Writer, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(r)
		return
	}
	fmt.Fprintf(w, "%-26s %s\n", "baseline", r.Baseline)
	fmt.Fprintf(w, "%-26s %d × %d bytes in %.2f s\n", "messages", r.Messages, r.Bytes, r.Seconds)
	fmt.Fprintf(w, "%-26s %.0f\n", "messages/s", r.PerSec)
	if r.Latency != nil {
		fmt.Fprintf(w, "%-26s %s\n", "publish → ack", r.Latency)
	}
}

// sampleEnvelope is a frame the size of a typical content envelope of the gateway.
func sampleEnvelope(size int) []byte {
	b := []byte(`{"id":"000001-000000000003-0002-07e91278745b","chunk":{"type":"TEXT_MESSAGE_CONTENT","messageId":"bench-x.msg1","delta":"`)
	for len(b) < size-3 {
		b = append(b, 't')
	}
	return append(b, `"}}`...)
}

// rawJetStreamMain measures asynchronous JetStream publishes of event-sized messages to a
// file-storage stream on an embedded server (the gateway's own setup), or on --nats-url.
// With --rate it measures latency instead: every publisher publishes synchronously, one
// message at a time on a fixed schedule (the publishers evenly out of phase), so that all
// of them together publish --rate messages per second, and the report gives the publish →
// acknowledgement latencies: what one durable write costs on this machine at that load.
func rawJetStreamMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench raw-jetstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	msgs := fs.Int("msgs", 200_000, "messages to publish")
	size := fs.Int("size", 150, "bytes per message")
	pubs := fs.Int("publishers", 4, "goroutines publishing at once, each to its own subjects")
	subjects := fs.Int("subjects", 50, "subjects per publisher (the gateway writes one subject per run)")
	pending := fs.Int("max-pending", 4000, "asynchronous publishes in flight per connection")
	dataDir := fs.String("data-dir", "", "storage directory of the embedded server (default: a temporary one, removed after)")
	natsURL := fs.String("nats-url", "", "use this NATS server instead of an embedded one")
	rate := fs.Float64("rate", 0, "measure latency: synchronous publishes paced to this many messages/s in all (0: as fast as possible, asynchronous)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *msgs < 1 || *size < 1 || *pubs < 1 || *subjects < 1 || *pending < 1 || *rate < 0 {
		fmt.Fprintln(stderr, "wsbench raw-jetstream: counts must be positive")
		return 2
	}
	rep, err := rawJetStream(ctx, *natsURL, *dataDir, *msgs, *size, *pubs, *subjects, *pending, *rate)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench raw-jetstream:", err)
		return 1
	}
	rep.write(stdout, *asJSON)
	return 0
}

func rawJetStream(ctx context.Context, natsURL, dataDir string, msgs, size, pubs, subjects, pending int, rate float64) (*rawReport, error) {
	if natsURL == "" {
		dir := dataDir
		if dir == "" {
			d, err := os.MkdirTemp("", "wsbench-js-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(d)
			dir = d
		}
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
		if err != nil {
			return nil, fmt.Errorf("embedded server: %w", err)
		}
		ns.Start()
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		if !ns.ReadyForConnections(30 * time.Second) {
			return nil, errors.New("embedded server: not ready")
		}
		natsURL = ns.ClientURL()
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(pending))
	if err != nil {
		return nil, err
	}
	stream := "WSBENCH_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: stream, Subjects: []string{stream + ".>"},
		Storage: natsjs.FileStorage, Retention: natsjs.LimitsPolicy, Discard: natsjs.DiscardOld,
		MaxAge: time.Hour, AllowDirect: true}); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), stream)
	body := sampleEnvelope(size)
	per := msgs / pubs
	// A paced publisher's k-th message is due at its phase plus k periods.
	period := time.Duration(0)
	if rate > 0 {
		period = time.Duration(float64(pubs) / rate * float64(time.Second))
	}
	lat := make([][]time.Duration, pubs)
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, pubs)
	for p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			phase := start.Add(period * time.Duration(p) / time.Duration(pubs))
			for i := range per {
				subj := stream + ".p" + strconv.Itoa(p) + ".s" + strconv.Itoa(i%subjects)
				if period == 0 {
					if _, err := js.PublishAsync(subj, body, natsjs.WithStallWait(time.Minute)); err != nil {
						errc <- fmt.Errorf("publish: %w", err)
						return
					}
					continue
				}
				if wait := time.Until(phase.Add(time.Duration(i) * period)); wait > 0 {
					time.Sleep(wait)
				}
				t := time.Now()
				if _, err := js.Publish(ctx, subj, body); err != nil {
					errc <- fmt.Errorf("publish: %w", err)
					return
				}
				lat[p] = append(lat[p], time.Since(t))
			}
		}()
	}
	wg.Wait()
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(5 * time.Minute):
		return nil, errors.New("acks not all received within 5 minutes")
	}
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	info, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	stored := int64(info.CachedInfo().State.Msgs)
	if stored != int64(per*pubs) {
		return nil, fmt.Errorf("stream holds %d messages, published %d", stored, per*pubs)
	}
	rep := &rawReport{Baseline: "jetstream async publish (file storage)", Messages: stored, Bytes: len(body),
		Seconds: elapsed.Seconds(), PerSec: float64(stored) / elapsed.Seconds(), Publishers: pubs}
	if period > 0 {
		rep.Baseline, rep.Rate = "jetstream synchronous publish, paced (file storage)", rate
		rep.Latency = summarize(slices.Concat(lat...))
	}
	return rep, nil
}

// rawWebSocketMain measures text frames written by coder/websocket servers and read by
// coder/websocket clients over loopback, in this one process.
func rawWebSocketMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench raw-websocket", flag.ContinueOnError)
	fs.SetOutput(stderr)
	conns := fs.Int("conns", 50, "sockets")
	frames := fs.Int("frames", 4000, "frames written to each socket")
	size := fs.Int("size", 150, "bytes per frame")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *conns < 1 || *frames < 1 || *size < 1 {
		fmt.Fprintln(stderr, "wsbench raw-websocket: counts must be positive")
		return 2
	}
	rep, err := rawWebSocket(ctx, *conns, *frames, *size)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench raw-websocket:", err)
		return 1
	}
	rep.write(stdout, *asJSON)
	return 0
}

func rawWebSocket(ctx context.Context, conns, frames, size int) (*rawReport, error) {
	body := sampleEnvelope(size)
	start := make(chan struct{})
	var handlers sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		select {
		case <-start:
		case <-r.Context().Done():
			return
		}
		for range frames {
			if err := c.Write(r.Context(), websocket.MessageText, body); err != nil {
				return
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln)
	defer func() { srv.Close(); handlers.Wait() }()
	u := "ws://" + ln.Addr().String()
	cs := make([]*websocket.Conn, conns)
	for i := range cs {
		c, _, err := websocket.Dial(ctx, u, nil)
		if err != nil {
			return nil, fmt.Errorf("dial: %w", err)
		}
		defer c.CloseNow()
		cs[i] = c
	}
	var got sync.WaitGroup
	counts := make([]int64, conns)
	t0 := time.Now()
	close(start)
	for i, c := range cs {
		got.Add(1)
		go func() {
			defer got.Done()
			buf := make([]byte, 0, 1024)
			for {
				_, r, err := c.Reader(ctx)
				if err != nil {
					return
				}
				buf, err = readAllInto(buf[:0], r)
				if err != nil {
					return
				}
				counts[i]++
			}
		}()
	}
	got.Wait()
	elapsed := time.Since(t0)
	var n int64
	for _, c := range counts {
		n += c
	}
	if n != int64(conns*frames) {
		return nil, fmt.Errorf("received %d frames, sent %d", n, conns*frames)
	}
	return &rawReport{Baseline: "coder/websocket text frames (loopback)", Messages: n, Bytes: len(body),
		Seconds: elapsed.Seconds(), PerSec: float64(n) / elapsed.Seconds(), Conns: conns}, nil
}

// readAllInto appends r's bytes to buf.
func readAllInto(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
