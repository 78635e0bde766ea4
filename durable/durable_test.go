package durable

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nats "github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/jetstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// gateways starts n handlers, each on its own NATS connection to one embedded server (as n
// gateway processes sharing a NATS), and returns their test servers.
func gateways(tb testing.TB, n int, cfg Config) []*httptest.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var url string
	var out []*httptest.Server
	for i := range n {
		s, err := jetstream.Open(ctx, jetstream.Config{DataDir: tb.TempDir(), URLs: url})
		if err != nil {
			tb.Fatalf("jetstream.Open: %v", err)
		}
		tb.Cleanup(func() { s.Close() })
		if i == 0 {
			url = s.ClientURL()
		}
		c := cfg
		c.Conn, c.JetStream = s.Conn(), s.JetStream()
		h, err := New(ctx, c)
		if err != nil {
			tb.Fatalf("New: %v", err)
		}
		mux := http.NewServeMux()
		for _, p := range h.Patterns() {
			mux.Handle(p, h)
		}
		srv := httptest.NewServer(mux)
		tb.Cleanup(srv.Close)
		out = append(out, srv)
	}
	return out
}

// do sends one request and returns the response with its body read.
func do(tb testing.TB, method, url string, hdr map[string]string, body string) (*http.Response, string) {
	tb.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestParseOffset(t *testing.T) {
	for _, tc := range []struct {
		in   string
		seq  uint64
		good bool
	}{
		{zeroOffset, 0, true},
		{formatOffset(42), 42, true},
		{formatOffset(maxOffsetSeq), maxOffsetSeq, true},
		{"-1", 0, false},
		{"now", 0, false},
		{"", 0, false},
		{"0000000000000042", 0, false},
		{"0000000000000042_0000000000000001", 0, false},
		{"000000000000004x_0000000000000000", 0, false},
		{"0000000000000042_0000000000000000 ", 0, false},
		{"+000000000000042_0000000000000000", 0, false},
	} {
		seq, ok := parseOffset(tc.in)
		if ok != tc.good || seq != tc.seq {
			t.Errorf("parseOffset(%q) = %d, %v, want %d, %v", tc.in, seq, ok, tc.seq, tc.good)
		}
	}
	if a, b := formatOffset(9), formatOffset(10); !(a < b) {
		t.Errorf("formatOffset(9) = %q is not below formatOffset(10) = %q", a, b)
	}
}

// TestAcrossGateways writes a stream through one gateway and reads, tails and appends it
// through the other.
func TestAcrossGateways(t *testing.T) {
	gw := gateways(t, 2, Config{LongPollTimeout: 5 * time.Second})
	a, b := gw[0].URL+"/v1/stream/chat/run-1", gw[1].URL+"/v1/stream/chat/run-1"
	if resp, _ := do(t, "PUT", a, map[string]string{"Content-Type": "application/json"}, `[{"n":1}]`); resp.StatusCode != 201 {
		t.Fatalf("PUT = %d, want 201", resp.StatusCode)
	}
	resp, body := do(t, "GET", b+"?offset=-1", nil, "")
	if resp.StatusCode != 200 || body != `[{"n":1}]` {
		t.Fatalf("GET through the other gateway = %d %q, want 200 [{\"n\":1}]", resp.StatusCode, body)
	}
	tail := resp.Header.Get("Stream-Next-Offset")

	// A long-poll on gateway b is woken by an append through gateway a.
	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		resp, body := do(t, "GET", b+"?live=long-poll&offset="+tail, nil, "")
		got <- result{resp.StatusCode, body}
	}()
	time.Sleep(200 * time.Millisecond)
	if resp, _ := do(t, "POST", a, map[string]string{"Content-Type": "application/json"}, `[{"n":2},{"n":3}]`); resp.StatusCode != 204 {
		t.Fatalf("POST = %d, want 204", resp.StatusCode)
	}
	select {
	case r := <-got:
		if r.code != 200 || r.body != `[{"n":2},{"n":3}]` {
			t.Fatalf("long-poll = %d %q, want 200 [{\"n\":2},{\"n\":3}]", r.code, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll not woken by an append through the other gateway")
	}

	// The TanStack adapter's path shape names the same stream.
	resp, body = do(t, "GET", gw[1].URL+"/streams/chat%2Frun-1?offset=-1", nil, "")
	if resp.StatusCode != 200 || body != `[{"n":1},{"n":2},{"n":3}]` {
		t.Fatalf("GET /streams/chat%%2Frun-1 = %d %q, want the three values", resp.StatusCode, body)
	}
}

// TestProducerRetryOtherGateway retries an idempotent producer's append on the other
// gateway, also after the first gateway stored it without recording it (it died between the
// two), and expects it stored once and answered 204 with the offset.
func TestProducerRetryOtherGateway(t *testing.T) {
	gw := gateways(t, 2, Config{})
	a, b := gw[0].URL+"/v1/stream/p", gw[1].URL+"/v1/stream/p"
	do(t, "PUT", a, map[string]string{"Content-Type": "text/plain"}, "")
	prod := func(seq int) map[string]string {
		return map[string]string{"Content-Type": "text/plain", "Producer-Id": "w1", "Producer-Epoch": "0",
			"Producer-Seq": strconv.Itoa(seq)}
	}
	first, _ := do(t, "POST", a, prod(0), "a")
	if first.StatusCode != 200 {
		t.Fatalf("POST seq 0 = %d, want 200", first.StatusCode)
	}
	retry, _ := do(t, "POST", b, prod(0), "a")
	if retry.StatusCode != 204 || retry.Header.Get("Stream-Next-Offset") != first.Header.Get("Stream-Next-Offset") {
		t.Fatalf("retry on the other gateway = %d offset %q, want 204 offset %q", retry.StatusCode,
			retry.Header.Get("Stream-Next-Offset"), first.Header.Get("Stream-Next-Offset"))
	}

	// Seq 1 is stored as a dead gateway would have left it: in the log, not in the metadata.
	st := gatewayStore(t, gw)
	m, _, err := st.get(context.Background(), key("anonymous", "p"))
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(st.subject(m.ID))
	msg.Data = []byte("b")
	msg.Header.Set(hdrProducer, "w1")
	msg.Header.Set(hdrEpoch, "0")
	msg.Header.Set(hdrPSeq, "1")
	if _, err := st.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, "POST", b, prod(1), "b"); resp.StatusCode != 204 || resp.Header.Get("Stream-Next-Offset") == "" {
		t.Fatalf("retry of an unrecorded append = %d offset %q, want 204 with an offset", resp.StatusCode, resp.Header.Get("Stream-Next-Offset"))
	}
	if resp, _ := do(t, "POST", a, prod(2), "c"); resp.StatusCode != 200 {
		t.Fatalf("POST seq 2 = %d, want 200", resp.StatusCode)
	}
	if _, body := do(t, "GET", a+"?offset=-1", nil, ""); body != "abc" {
		t.Fatalf("GET = %q, want abc (each append stored once)", body)
	}
}

// gatewayStore returns the first gateway's store, to tamper with the log.
func gatewayStore(tb testing.TB, gw []*httptest.Server) *store {
	tb.Helper()
	return handlerOf(gw[0]).st
}

// handlerOf returns the Handler a test server of gateways serves.
func handlerOf(srv *httptest.Server) *Handler {
	h, _ := srv.Config.Handler.(*http.ServeMux).Handler(httptest.NewRequest("GET", "/v1/stream/x", nil))
	return h.(*Handler)
}

// TestCloseEndsLiveReads: Close ends an SSE response and answers a long-poll 204 at once,
// so that an HTTP server's Shutdown is not held by them.
func TestCloseEndsLiveReads(t *testing.T) {
	gw := gateways(t, 1, Config{LongPollTimeout: time.Minute})
	url := gw[0].URL + "/v1/stream/live"
	resp, _ := do(t, "PUT", url, map[string]string{"Content-Type": "text/plain"}, "x")
	tail := resp.Header.Get("Stream-Next-Offset")
	sse, err := http.Get(url + "?offset=-1&live=sse")
	if err != nil {
		t.Fatal(err)
	}
	defer sse.Body.Close()
	sseDone := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(sse.Body)
		sseDone <- err
	}()
	poll := make(chan int, 1)
	go func() {
		resp, _ := do(t, "GET", url+"?live=long-poll&offset="+tail, nil, "")
		poll <- resp.StatusCode
	}()
	time.Sleep(300 * time.Millisecond)
	handlerOf(gw[0]).Close()
	select {
	case code := <-poll:
		if code != 204 {
			t.Errorf("long-poll after Close = %d, want 204", code)
		}
	case <-time.After(5 * time.Second):
		t.Error("long-poll still waiting 5 s after Close")
	}
	select {
	case err := <-sseDone:
		if err != nil {
			t.Errorf("SSE body after Close: %v, want its end", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("SSE response still open 5 s after Close")
	}
}

// TestConcurrentAppends appends from many clients through two gateways at once and expects
// every append stored once, with strictly increasing offsets.
func TestConcurrentAppends(t *testing.T) {
	gw := gateways(t, 2, Config{})
	do(t, "PUT", gw[0].URL+"/v1/stream/c", map[string]string{"Content-Type": "application/json"}, "")
	const writers, each = 8, 10
	var wg sync.WaitGroup
	offsets := make(chan string, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				url := gw[(w+i)%2].URL + "/v1/stream/c"
				resp, _ := do(t, "POST", url, map[string]string{"Content-Type": "application/json"}, fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))
				if resp.StatusCode != 204 {
					t.Errorf("POST = %d, want 204", resp.StatusCode)
				}
				offsets <- resp.Header.Get("Stream-Next-Offset")
			}
		}()
	}
	wg.Wait()
	close(offsets)
	seen := map[string]bool{}
	for o := range offsets {
		if seen[o] {
			t.Errorf("offset %s answered twice", o)
		}
		seen[o] = true
	}
	_, body := do(t, "GET", gw[1].URL+"/v1/stream/c?offset=-1", nil, "")
	if n := strings.Count(body, `"w":`); n != writers*each {
		t.Fatalf("GET holds %d values, want %d", n, writers*each)
	}
}

// TestPrincipalAndLimits: a stream belongs to its principal; a body over the limit is 413.
func TestPrincipalAndLimits(t *testing.T) {
	gw := gateways(t, 1, Config{MaxBodyBytes: 1024, Principal: func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "", fmt.Errorf("no user")
	}})
	url := gw[0].URL + "/v1/stream/mine"
	if resp, _ := do(t, "PUT", url, nil, ""); resp.StatusCode != 401 {
		t.Fatalf("PUT without a principal = %d, want 401", resp.StatusCode)
	}
	do(t, "PUT", url, map[string]string{"X-User": "alice", "Content-Type": "text/plain"}, "hi")
	if resp, _ := do(t, "GET", url, map[string]string{"X-User": "bob"}, ""); resp.StatusCode != 404 {
		t.Fatalf("GET by another principal = %d, want 404", resp.StatusCode)
	}
	if resp, body := do(t, "GET", url, map[string]string{"X-User": "alice"}, ""); resp.StatusCode != 200 || body != "hi" {
		t.Fatalf("GET by the owner = %d %q, want 200 hi", resp.StatusCode, body)
	}
	big := strings.Repeat("x", 2048)
	if resp, _ := do(t, "POST", url, map[string]string{"X-User": "alice", "Content-Type": "text/plain"}, big); resp.StatusCode != 413 {
		t.Fatalf("POST of 2 KiB with a 1 KiB limit = %d, want 413", resp.StatusCode)
	}
}

func TestWriteSSEData(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a", "data:a\n\n"},
		{"a\nb", "data:a\ndata:b\n\n"},
		{"a\r\nb", "data:a\ndata:b\n\n"},
		{"a\rb\r", "data:a\ndata:b\ndata:\n\n"},
		{"", "data:\n\n"},
	} {
		var buf bytes.Buffer
		writeSSEData(&buf, []byte(tc.in))
		if buf.String() != tc.want {
			t.Errorf("writeSSEData(%q) = %q, want %q", tc.in, buf.String(), tc.want)
		}
	}
}

// TestLongCatchUp reads a log longer than one SSE read (sseBatch) and than one catch-up
// response (MaxReadBytes): every message arrives once, in order.
func TestLongCatchUp(t *testing.T) {
	gw := gateways(t, 1, Config{MaxReadBytes: 4096})
	url := gw[0].URL + "/v1/stream/long"
	do(t, "PUT", url, map[string]string{"Content-Type": "text/plain"}, "")
	const n = sseBatch + 300
	var want strings.Builder
	for i := range n {
		v := fmt.Sprintf("%d;", i)
		want.WriteString(v)
		if resp, _ := do(t, "POST", url, map[string]string{"Content-Type": "text/plain"}, v); resp.StatusCode != 204 {
			t.Fatalf("POST %d = %d, want 204", i, resp.StatusCode)
		}
	}
	// Catch-up in pages.
	var got strings.Builder
	offset, pages := "-1", 0
	for {
		resp, body := do(t, "GET", url+"?offset="+offset, nil, "")
		got.WriteString(body)
		offset = resp.Header.Get("Stream-Next-Offset")
		pages++
		if resp.Header.Get("Stream-Up-To-Date") == "true" {
			break
		}
	}
	if got.String() != want.String() || pages < 2 {
		t.Fatalf("paged catch-up in %d pages = %d bytes, want %d bytes in several pages", pages, got.Len(), want.Len())
	}
	// SSE.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"?offset=-1&live=sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got.Reset()
	sc := bufio.NewScanner(resp.Body)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case event == "data" && strings.HasPrefix(line, "data:"):
			got.WriteString(line[5:])
		case event == "control" && strings.Contains(line, `"upToDate":true`):
			if got.String() != want.String() {
				t.Fatalf("SSE catch-up = %d bytes, want %d", got.Len(), want.Len())
			}
			return
		}
	}
	t.Fatalf("SSE ended before its catch-up: %v", sc.Err())
}

// TestStaleCacheOtherGateway: gateway a caches the metadata its appends wrote; changes made
// through gateway b meanwhile (a new producer epoch, a delete and re-create) must still
// decide a's next answers.
func TestStaleCacheOtherGateway(t *testing.T) {
	gw := gateways(t, 2, Config{})
	a, b := gw[0].URL+"/v1/stream/cache", gw[1].URL+"/v1/stream/cache"
	prod := func(epoch, seq int) map[string]string {
		return map[string]string{"Content-Type": "text/plain", "Producer-Id": "w", "Producer-Epoch": strconv.Itoa(epoch),
			"Producer-Seq": strconv.Itoa(seq)}
	}
	do(t, "PUT", a, map[string]string{"Content-Type": "text/plain"}, "")
	for seq := range 3 {
		if resp, _ := do(t, "POST", a, prod(0, seq), "a"); resp.StatusCode != 200 {
			t.Fatalf("POST epoch 0 seq %d on a = %d, want 200", seq, resp.StatusCode)
		}
	}
	if resp, _ := do(t, "POST", b, prod(1, 0), "b"); resp.StatusCode != 200 {
		t.Fatalf("POST epoch 1 seq 0 on b = %d, want 200", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", a, prod(0, 2), "a"); resp.StatusCode != 403 || resp.Header.Get("Producer-Epoch") != "1" {
		t.Fatalf("retry of epoch 0 seq 2 on a after epoch 1 on b = %d (epoch %q), want 403 (epoch 1)", resp.StatusCode, resp.Header.Get("Producer-Epoch"))
	}
	if resp, _ := do(t, "POST", a, prod(0, 3), "a"); resp.StatusCode != 403 {
		t.Fatalf("epoch 0 seq 3 on a after epoch 1 on b = %d, want 403", resp.StatusCode)
	}

	// Deleted and created again through b: a's next append goes to the new stream.
	do(t, "POST", a, map[string]string{"Content-Type": "text/plain"}, "x")
	if resp, _ := do(t, "DELETE", b, nil, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE on b = %d, want 204", resp.StatusCode)
	}
	do(t, "PUT", b, map[string]string{"Content-Type": "text/plain"}, "")
	if resp, _ := do(t, "POST", a, map[string]string{"Content-Type": "text/plain"}, "new"); resp.StatusCode != 204 {
		t.Fatalf("POST on a after the re-create = %d, want 204", resp.StatusCode)
	}
	if _, body := do(t, "GET", b+"?offset=-1", nil, ""); body != "new" {
		t.Fatalf("GET of the new stream = %q, want new", body)
	}
}

// TestReadersPerPrincipal: a principal's reads in progress are bounded (live SSE reads held
// open here); a read beyond is 429 naming the limit and counted; another principal, and a
// principal given more by PrincipalReaders, read meanwhile; a read that ended frees its place.
// The 429 is answered after the refusal delay.
func TestReadersPerPrincipal(t *testing.T) {
	const max, delay = 2, 300 * time.Millisecond
	var refused atomic.Int32
	gw := gateways(t, 1, Config{MaxReaders: max, PrincipalReaders: map[string]int{"svc": max + 1}, RefusalDelay: delay,
		Refused: func() { refused.Add(1) }, Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }})
	hdr := map[string]string{"Content-Type": "text/plain"}
	for _, u := range []string{"alice", "bob", "svc"} {
		hdr["X-User"] = u
		do(t, "PUT", gw[0].URL+"/v1/stream/s", hdr, "hi")
	}
	// open starts a live SSE read as user and returns its response once it streams.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(user string, rctx context.Context) *http.Response {
		req, _ := http.NewRequestWithContext(rctx, "GET", gw[0].URL+"/v1/stream/s?offset=-1&live=sse", nil)
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET as %s: %v", user, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	first, firstCancel := context.WithCancel(ctx)
	for i := 0; i < max; i++ {
		rctx := ctx
		if i == 0 {
			rctx = first
		}
		if resp := open("alice", rctx); resp.StatusCode != 200 {
			t.Fatalf("alice's read %d under the bound: %d", i, resp.StatusCode)
		}
	}
	start := time.Now()
	resp := open("alice", ctx)
	if took := time.Since(start); took < delay {
		t.Errorf("alice's read beyond the bound answered in %v, want after the refusal delay %v", took, delay)
	}
	var b []byte
	if resp.StatusCode != 200 { // a 200 would stream on
		b, _ = io.ReadAll(resp.Body)
	}
	if resp.StatusCode != http.StatusTooManyRequests || strings.TrimSpace(string(b)) != MsgTooManyReaders {
		t.Errorf("alice's read beyond the bound: %d %q, want 429 %q", resp.StatusCode, b, MsgTooManyReaders)
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("refusals counted: %d, want 1", n)
	}
	if resp := open("bob", ctx); resp.StatusCode != 200 {
		t.Errorf("bob's read while alice is at her bound: %d", resp.StatusCode)
	}
	for i := 0; i < max+1; i++ {
		if resp := open("svc", ctx); resp.StatusCode != 200 {
			t.Errorf("svc's read %d under its own bound of %d: %d", i, max+1, resp.StatusCode)
		}
	}
	firstCancel() // alice's first read ends: its place is free
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := open("alice", ctx)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's read after one ended: %d", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
