// Command dsbench is a load generator for any server of the Durable Streams protocol:
// wsgateway's /v1/stream, or the published Node reference server
// (testdata/durable/reference-server.mjs), for side-by-side figures.
//
//	dsbench append [flags]   idempotent producers appending JSON batches: appends/s
//	dsbench sse [flags]      fill a stream, then time one SSE catch-up read of it: messages/s
//
// append: --producers producers, each on its own stream (or, with --shared, all on one), POST
// JSON arrays of --batch objects of --msg-bytes bytes each with Producer-Id, Producer-Epoch
// and Producer-Seq, one request after the other, for --duration. The report counts messages
// (array elements) and requests per second, and request latency percentiles. Every response
// must be 200 with a Stream-Next-Offset above the previous one.
//
// sse: a stream is filled with --messages JSON messages of --msg-bytes bytes, one per POST,
// from --fill-clients clients at once; then one GET ?offset=-1&live=sse reads data events
// until the control event that says upToDate, and the report gives the messages (JSON values)
// read per second. Every message must arrive exactly once.
//
// With --pid, the server's process id, both report the server's CPU time (user and system,
// from /proc/<pid>/stat) per message over the load (append) or the read (sse): steadier than
// any rate on a shared machine.
//
// The output is one JSON object on stdout. Exit status: 0 on success, 1 when the run found an
// error, 2 for a bad command line.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "append" && args[0] != "sse") {
		fmt.Fprintln(stderr, "usage: dsbench append|sse [flags]")
		return 2
	}
	fs := flag.NewFlagSet("dsbench "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:8080/v1/stream", "URL of the streams' prefix")
	name := fs.String("name", "", "stream name prefix (default: dsbench-<time>)")
	msgBytes := fs.Int("msg-bytes", 1024, "bytes of one JSON message")
	producers := fs.Int("producers", 50, "append: concurrent idempotent producers")
	batch := fs.Int("batch", 32, "append: messages per request (one JSON array)")
	duration := fs.Duration("duration", 10*time.Second, "append: how long to append")
	shared := fs.Bool("shared", false, "append: all producers on one stream")
	messages := fs.Int("messages", 100000, "sse: messages in the stream")
	fillClients := fs.Int("fill-clients", 32, "sse: clients filling the stream at once")
	pid := fs.Int("pid", 0, "the server's process id, to report its CPU time per message")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *name == "" {
		*name = fmt.Sprintf("dsbench-%d", time.Now().UnixNano())
	}
	b := &bench{base: strings.TrimSuffix(*base, "/"), pid: *pid, client: &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 256, DisableCompression: true}}}
	var res any
	var err error
	if args[0] == "append" {
		res, err = b.appendLoad(ctx, *name, *producers, *batch, *msgBytes, *duration, *shared)
	} else {
		res, err = b.sseCatchUp(ctx, *name, *messages, *msgBytes, *fillClients)
	}
	out, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(out))
	if err != nil {
		fmt.Fprintln(stderr, "dsbench:", err)
		return 1
	}
	return 0
}

type bench struct {
	base   string
	pid    int // the server's, 0: unknown
	client *http.Client
}

// cpu returns the server's user and system CPU time from /proc/<pid>/stat, 0 without --pid.
func (b *bench) cpu() (time.Duration, error) {
	if b.pid == 0 {
		return 0, nil
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(b.pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count the fields after its parenthesis.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", b.pid, len(f))
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// cpuPerMessage returns the server's CPU microseconds per message since cpu0, or 0.
func (b *bench) cpuPerMessage(cpu0 time.Duration, messages int64) (float64, error) {
	cpu1, err := b.cpu()
	if err != nil || b.pid == 0 || messages == 0 {
		return 0, err
	}
	return float64((cpu1 - cpu0).Microseconds()) / float64(messages), nil
}

// do sends one request and returns its status, headers and body.
func (b *bench) do(ctx context.Context, method, url string, hdr map[string]string, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, rb, err
}

func (b *bench) create(ctx context.Context, name string) error {
	code, _, body, err := b.do(ctx, "PUT", b.base+"/"+name, map[string]string{"Content-Type": "application/json"}, nil)
	if err == nil && code != 201 && code != 200 {
		err = fmt.Errorf("PUT %s: %d %s", name, code, body)
	}
	return err
}

// message returns a JSON object of about n bytes, tagged with its producer and number.
func message(p, i, n int) []byte {
	head := fmt.Sprintf(`{"p":%d,"i":%d,"pad":"`, p, i)
	pad := max(n-len(head)-2, 0)
	return []byte(head + strings.Repeat("x", pad) + `"}`)
}

type appendResult struct {
	Producers   int     `json:"producers"`
	Batch       int     `json:"batch"`
	MsgBytes    int     `json:"msg_bytes"`
	Streams     int     `json:"streams"`
	Seconds     float64 `json:"seconds"`
	Requests    int64   `json:"requests"`
	Messages    int64   `json:"messages"`
	MessagesPS  float64 `json:"messages_per_s"`
	RequestsPS  float64 `json:"requests_per_s"`
	P50Millis   float64 `json:"p50_ms"`
	P99Millis   float64 `json:"p99_ms"`
	CPUMicros   float64 `json:"server_cpu_us_per_msg,omitempty"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	StoredCheck string  `json:"stored_check,omitempty"`
}

func (b *bench) appendLoad(ctx context.Context, name string, producers, batch, msgBytes int, d time.Duration, shared bool) (appendResult, error) {
	res := appendResult{Producers: producers, Batch: batch, MsgBytes: msgBytes, Streams: producers}
	if shared {
		res.Streams = 1
	}
	for s := range res.Streams {
		if err := b.create(ctx, fmt.Sprintf("%s-%d", name, s)); err != nil {
			return res, err
		}
	}
	var requests, errs atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	fail := func(err error) {
		errs.Add(1)
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	cpu0, err := b.cpu()
	if err != nil {
		return res, err
	}
	lctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("%s/%s-%d", b.base, name, p%res.Streams)
			var my []time.Duration
			last := ""
			for seq := 0; lctx.Err() == nil; seq++ {
				parts := make([][]byte, batch)
				for i := range parts {
					parts[i] = message(p, seq*batch+i, msgBytes)
				}
				body := append(append([]byte{'['}, bytes.Join(parts, []byte{','})...), ']')
				t0 := time.Now()
				code, hdr, rb, err := b.do(ctx, "POST", url, map[string]string{"Content-Type": "application/json",
					"Producer-Id": fmt.Sprintf("p%d", p), "Producer-Epoch": "0", "Producer-Seq": strconv.Itoa(seq)}, body)
				if err != nil {
					fail(err)
					return
				}
				off := hdr.Get("Stream-Next-Offset")
				if code != 200 || off <= last {
					fail(fmt.Errorf("POST producer %d seq %d: %d offset %q after %q: %s", p, seq, code, off, last, rb))
					return
				}
				last = off
				my = append(my, time.Since(t0))
				requests.Add(1)
			}
			mu.Lock()
			lat = append(lat, my...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	res.Seconds = el
	res.Requests = requests.Load()
	res.Messages = res.Requests * int64(batch)
	res.MessagesPS = float64(res.Messages) / el
	res.RequestsPS = float64(res.Requests) / el
	res.Errors = errs.Load()
	if res.CPUMicros, err = b.cpuPerMessage(cpu0, res.Messages); err != nil {
		return res, err
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		res.P50Millis = float64(lat[len(lat)/2].Microseconds()) / 1000
		res.P99Millis = float64(lat[len(lat)*99/100].Microseconds()) / 1000
	}
	if firstErr != nil {
		res.FirstError = firstErr.Error()
		return res, firstErr
	}
	// Every acknowledged message is stored once: count the first stream's values.
	code, _, body, err := b.do(ctx, "GET", fmt.Sprintf("%s/%s-0?offset=-1", b.base, name), nil, nil)
	if err == nil && code == 200 {
		res.StoredCheck = fmt.Sprintf("stream 0 holds %d values on its first page", bytes.Count(body, []byte(`{"p":`)))
	}
	return res, nil
}

type sseResult struct {
	Messages     int     `json:"messages"`
	MsgBytes     int     `json:"msg_bytes"`
	FillSeconds  float64 `json:"fill_seconds"`
	FillPS       float64 `json:"fill_messages_per_s"`
	ReadSeconds  float64 `json:"read_seconds"`
	MessagesRead int     `json:"messages_read"`
	DataEvents   int     `json:"data_events"`
	MessagesPS   float64 `json:"messages_per_s"`
	MiBPS        float64 `json:"mib_per_s"`
	CPUMicros    float64 `json:"server_cpu_us_per_msg,omitempty"` // over the read
}

func (b *bench) sseCatchUp(ctx context.Context, name string, messages, msgBytes, clients int) (sseResult, error) {
	res := sseResult{Messages: messages, MsgBytes: msgBytes}
	if err := b.create(ctx, name); err != nil {
		return res, err
	}
	url := b.base + "/" + name
	start := time.Now()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= messages || ctx.Err() != nil {
					return
				}
				code, _, rb, err := b.do(ctx, "POST", url, map[string]string{"Content-Type": "application/json"}, message(0, i, msgBytes))
				if err == nil && code != 204 && code != 200 {
					err = fmt.Errorf("POST: %d %s", code, rb)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return res, firstErr
	}
	res.FillSeconds = time.Since(start).Seconds()
	res.FillPS = float64(messages) / res.FillSeconds

	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, "GET", url+"?offset=-1&live=sse", nil)
	cpu0, err := b.cpu()
	if err != nil {
		return res, err
	}
	start = time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return res, fmt.Errorf("GET live=sse: %d", resp.StatusCode)
	}
	seen := make([]bool, messages)
	var bytesRead int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var event string
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		bytesRead += int64(len(line)) + 1
		switch {
		case bytes.HasPrefix(line, []byte("event:")):
			event = strings.TrimSpace(string(line[6:]))
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data, line[5:]...)
		case len(line) == 0:
			if event == "data" {
				res.DataEvents++
				var vals []struct {
					I int `json:"i"`
				}
				if err := json.Unmarshal(data, &vals); err != nil {
					return res, fmt.Errorf("data event: %v", err)
				}
				for _, v := range vals {
					if v.I < 0 || v.I >= messages || seen[v.I] {
						return res, fmt.Errorf("message %d out of range or read twice", v.I)
					}
					seen[v.I] = true
					res.MessagesRead++
				}
			} else if event == "control" && bytes.Contains(data, []byte(`"upToDate":true`)) && res.MessagesRead == messages {
				res.ReadSeconds = time.Since(start).Seconds()
				res.MessagesPS = float64(res.MessagesRead) / res.ReadSeconds
				res.MiBPS = float64(bytesRead) / res.ReadSeconds / (1 << 20)
				res.CPUMicros, err = b.cpuPerMessage(cpu0, int64(res.MessagesRead))
				return res, err
			}
			event, data = "", data[:0]
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	return res, errors.New("the SSE stream ended before the catch-up did")
}
