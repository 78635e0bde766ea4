package durable

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The exchange of TanStack AI's durableStream adapter (package @tanstack/ai-durable-stream,
// src/durable-stream.ts; docs/TRANSPORTS.md says why it is replayed here and not run): with
// options {server, streamPrefix}, a run's stream is
// <server>/streams/<encodeURIComponent(streamPrefix + "/" + runId)>. It creates it with a PUT
// of Content-Type application/json, appends each batch of chunks as one POST of an array of
// records {"v":1,"seq":n,"chunk":…} (seq counts chunks from 1) as an idempotent producer
// (a random Producer-Id, epoch 0, Producer-Seq counting POSTs from 0; a POST whose outcome
// it did not see is sent again as it was), and closes with a POST of Stream-Closed: true and
// no body. Create, append and close must each answer a Stream-Next-Offset, the close also
// Stream-Closed: true. A chunk's resume cursor is the Stream-Next-Offset from before its
// batch and its seq. It reads with GET ?offset=<that offset>&live=sse[&cursor=…]: every data
// event must be a JSON array of records and be followed by a control event with a string
// streamNextOffset and, unless streamClosed is true, a string streamCursor; records up to the
// cursor's seq are skipped; the read ends on streamClosed.

// adapterRecord is one record of the adapter's log.
type adapterRecord struct {
	V     int             `json:"v"`
	Seq   int             `json:"seq"`
	Chunk json.RawMessage `json:"chunk"`
}

// adapterControl is a control event's payload as the adapter checks it.
type adapterControl struct {
	Offset   *string `json:"streamNextOffset"`
	Cursor   *string `json:"streamCursor"`
	Closed   bool    `json:"streamClosed"`
	UpToDate bool    `json:"upToDate"`
}

// adapterRead reads url (the run's stream) from offset with live=sse as the adapter does,
// skips records up to seq after, and sends the others on out until a control event says
// streamClosed; it fails the test on anything the adapter would refuse.
func adapterRead(ctx context.Context, streamURL, offset string, after int, out chan<- adapterRecord) error {
	u, _ := url.Parse(streamURL)
	q := u.Query()
	q.Set("offset", offset)
	q.Set("live", "sse")
	u.RawQuery = q.Encode()
	req, _ := http.NewRequestWithContext(ctx, "GET", u.String(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("read: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	event, data, awaitingControl := "", "", false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(line[5:], " ")
		case line == "":
			switch event {
			case "data":
				var recs []adapterRecord
				if err := json.Unmarshal([]byte(data), &recs); err != nil {
					return fmt.Errorf("data event %q is not a JSON array of records: %v", data, err)
				}
				for _, r := range recs {
					if r.V != 1 || r.Seq < 1 || len(r.Chunk) == 0 {
						return fmt.Errorf("invalid record %+v", r)
					}
					if r.Seq > after {
						after = r.Seq
						out <- r
					}
				}
				awaitingControl = true
			case "control":
				var c adapterControl
				if err := json.Unmarshal([]byte(data), &c); err != nil || c.Offset == nil || *c.Offset == "" {
					return fmt.Errorf("control event %q without a streamNextOffset", data)
				}
				if !c.Closed && (c.Cursor == nil || *c.Cursor == "") {
					return fmt.Errorf("open control event %q without a streamCursor", data)
				}
				awaitingControl = false
				if c.Closed {
					return nil
				}
			default:
				return fmt.Errorf("unexpected SSE event %q", event)
			}
			event, data = "", ""
		}
	}
	if awaitingControl {
		return fmt.Errorf("data event without its control event")
	}
	return fmt.Errorf("read ended without streamClosed: %v", sc.Err())
}

// TestTanStackAdapterExchange writes a run's chunks through one gateway as the adapter does,
// with a retried POST going to the other gateway, while a reader on the other gateway tails
// it from its start; then resumes from a mid-run cursor. Every chunk arrives once, in order.
func TestTanStackAdapterExchange(t *testing.T) {
	gw := gateways(t, 2, Config{LongPollTimeout: 5 * time.Second})
	runID := "0c6e52c8-run"
	path := "/streams/" + url.PathEscape("runs/"+runID) // encodeURIComponent("runs/…")
	if !strings.Contains(path, "runs%2F") {
		t.Fatalf("path %q: the name must be one encoded segment", path)
	}
	a, b := gw[0].URL+path, gw[1].URL+path

	resp, _ := do(t, "PUT", a, map[string]string{"Content-Type": "application/json"}, "")
	created := resp.Header.Get("Stream-Next-Offset")
	if resp.StatusCode != 201 || created == "" {
		t.Fatalf("create = %d offset %q, want 201 with a Stream-Next-Offset", resp.StatusCode, created)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tail := make(chan adapterRecord, 64)
	tailErr := make(chan error, 1)
	go func() { tailErr <- adapterRead(ctx, b, "-1", 0, tail) }()

	chunks := []string{
		`{"type":"RUN_STARTED","threadId":"t1","runId":"` + runID + `"}`,
		`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hello "}`,
		`{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"world"}`,
		`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`,
		`{"type":"RUN_FINISHED","threadId":"t1","runId":"` + runID + `"}`,
	}
	batches := [][]string{chunks[:2], chunks[2:5], chunks[5:]}
	starts := []string{created} // the Stream-Next-Offset before each batch
	seq := 1
	for i, batch := range batches {
		var recs []string
		for _, c := range batch {
			recs = append(recs, fmt.Sprintf(`{"v":1,"seq":%d,"chunk":%s}`, seq, c))
			seq++
		}
		hdr := map[string]string{"Content-Type": "application/json", "Producer-Id": "4f1b-producer",
			"Producer-Epoch": "0", "Producer-Seq": strconv.Itoa(i)}
		body := "[" + strings.Join(recs, ",") + "]"
		resp, _ := do(t, "POST", a, hdr, body)
		next := resp.Header.Get("Stream-Next-Offset")
		if resp.StatusCode != 200 || next == "" || next <= starts[i] {
			t.Fatalf("append %d = %d offset %q after %q, want 200 and a higher offset", i, resp.StatusCode, next, starts[i])
		}
		if i == 1 { // the adapter's one retry of a POST whose answer it lost, through the other gateway
			retry, _ := do(t, "POST", b, hdr, body)
			if retry.StatusCode != 204 || retry.Header.Get("Stream-Next-Offset") != next {
				t.Fatalf("retried append = %d offset %q, want 204 offset %q", retry.StatusCode, retry.Header.Get("Stream-Next-Offset"), next)
			}
		}
		starts = append(starts, next)
	}
	resp, _ = do(t, "POST", a, map[string]string{"Stream-Closed": "true"}, "")
	if !(resp.StatusCode >= 200 && resp.StatusCode < 300) || resp.Header.Get("Stream-Next-Offset") == "" ||
		resp.Header.Get("Stream-Closed") != "true" {
		t.Fatalf("close = %d offset %q closed %q, want 2xx with an offset and Stream-Closed: true",
			resp.StatusCode, resp.Header.Get("Stream-Next-Offset"), resp.Header.Get("Stream-Closed"))
	}

	expect := func(what string, ch chan adapterRecord, errc <-chan error, from int) {
		t.Helper()
		if err := <-errc; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		close(ch)
		want := from
		for r := range ch {
			if r.Seq != want || string(r.Chunk) != chunks[want-1] {
				t.Fatalf("%s: record seq %d %s, want seq %d %s", what, r.Seq, r.Chunk, want, chunks[want-1])
			}
			want++
		}
		if want != len(chunks)+1 {
			t.Fatalf("%s: ended after seq %d, want all %d chunks", what, want-1, len(chunks))
		}
	}
	expect("tail from the start on the other gateway", tail, tailErr, 1)

	// A reconnect with the cursor of chunk 4 (its batch started at starts[1]) gets 5 and 6.
	resumed := make(chan adapterRecord, 64)
	resumedErr := make(chan error, 1)
	resumedErr <- adapterRead(ctx, b, starts[1], 4, resumed)
	expect("resume from chunk 4's cursor", resumed, resumedErr, 5)
}
