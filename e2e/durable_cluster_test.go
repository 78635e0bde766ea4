package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// dsStream is the gateway's default Durable Streams stream (durable.Config.Stream).
const dsStream = "WSGATEWAY_DS"

// TestClusterDurableLeaderKilled: idempotent producers append to one Durable Stream through
// two gateways on a three-node NATS cluster, every request to the other gateway than the
// last, and a reader tails it by long-poll, while the stream's leader is killed (SIGKILL).
// A failed append is retried with the same producer tuple, as the protocol's clients do.
// Every append must end up stored exactly once, in each producer's order, and the tailer
// must have read exactly what a final catch-up through either gateway reads.
func TestClusterDurableLeaderKilled(t *testing.T) {
	top := startTopology(t, "--durable-long-poll=2s")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	gws := []*gateway{top.A, top.B}
	client := &http.Client{Timeout: 15 * time.Second}
	path := "/v1/stream/cluster/leader-kill"
	send := func(gw *gateway, method, query string, hdr map[string]string, body []byte) (int, http.Header, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, gw.URL+path+query, bytes.NewReader(body))
		if err != nil {
			return 0, nil, nil, err
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b, err
	}
	if code, _, b, err := send(top.A, "PUT", "", map[string]string{"Content-Type": "application/json"}, nil); err != nil || code != 201 {
		t.Fatalf("PUT = %d %s %v, want 201", code, b, err)
	}

	type value struct {
		P int `json:"p"`
		S int `json:"s"`
	}
	const producers, appends = 4, 60
	var acked, retries atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hdr := map[string]string{"Content-Type": "application/json", "Producer-Id": fmt.Sprintf("p%d", p),
				"Producer-Epoch": "0"}
			n := p
			for s := 0; s < appends; s++ {
				hdr["Producer-Seq"] = strconv.Itoa(s)
				body, _ := json.Marshal(value{p, s})
				for {
					n++
					code, h, b, err := send(gws[n%2], "POST", "", hdr, body)
					if err == nil && (code == 200 || code == 204) && h.Get("Stream-Next-Offset") != "" {
						acked.Add(1)
						break
					}
					if err == nil && code < 500 {
						t.Errorf("producer %d seq %d: %d %s", p, s, code, b)
						return
					}
					if ctx.Err() != nil {
						t.Errorf("producer %d seq %d: not stored before the deadline (last: %d %v)", p, s, code, err)
						return
					}
					retries.Add(1)
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}

	// The tailer long-polls from its last offset, alternating gateways, retrying errors.
	var tailed []value
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		offset := "-1"
		for n := 0; len(tailed) < producers*appends && ctx.Err() == nil; n++ {
			code, h, b, err := send(gws[n%2], "GET", "?live=long-poll&offset="+offset, nil, nil)
			if err != nil || code >= 500 {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if code == 200 {
				var vs []value
				if err := json.Unmarshal(b, &vs); err != nil {
					t.Errorf("tail: %v: %s", err, b)
					return
				}
				tailed = append(tailed, vs...)
			} else if code != 204 {
				t.Errorf("tail: %d %s", code, b)
				return
			}
			offset = h.Get("Stream-Next-Offset")
		}
	}()

	for acked.Load() < producers*appends/3 {
		if ctx.Err() != nil {
			t.Fatal("the appends did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	leader := top.NATS.leaderOf(t, ctx, dsStream)
	leader.kill(t, syscall.SIGKILL)
	t.Logf("killed %s, the leader of %s, after %d appends", leader.Name, dsStream, acked.Load())
	wg.Wait()
	<-tailDone
	t.Logf("%d appends acknowledged, %d attempts retried", acked.Load(), retries.Load())

	check := func(who string, vs []value) {
		t.Helper()
		next := make([]int, producers)
		for i, v := range vs {
			if v.P < 0 || v.P >= producers || v.S != next[v.P] {
				t.Fatalf("%s: value %d is %+v, want producer %d's seq %d (no gap, no duplicate)", who, i, v, v.P, next[max(0, min(v.P, producers-1))])
			}
			next[v.P]++
		}
		if len(vs) != producers*appends {
			t.Fatalf("%s: %d values, want %d", who, len(vs), producers*appends)
		}
	}
	check("the tailer", tailed)
	for _, gw := range gws {
		var all []value
		offset := "-1"
		for {
			code, h, b, err := send(gw, "GET", "?offset="+offset, nil, nil)
			if err != nil || code != 200 {
				t.Fatalf("catch-up through %s: %d %v", gw.Addr, code, err)
			}
			var vs []value
			if err := json.Unmarshal(b, &vs); err != nil {
				t.Fatal(err)
			}
			all = append(all, vs...)
			offset = h.Get("Stream-Next-Offset")
			if h.Get("Stream-Up-To-Date") == "true" {
				break
			}
		}
		check("catch-up through "+gw.Addr, all)
		for i := range all {
			if all[i] != tailed[i] {
				t.Fatalf("catch-up through %s differs from the tailer at %d: %+v, %+v", gw.Addr, i, all[i], tailed[i])
			}
		}
	}
}
