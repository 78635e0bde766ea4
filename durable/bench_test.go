package durable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/jsoncompact"
)

// BenchmarkAppend measures one POST of 32 JSON messages of 1 KiB by an idempotent producer,
// each parallel producer on its own stream, through the handler on an embedded NATS server
// (dsbench append's load without HTTP): b.N POSTs in all. cpu-ns/op is the process's user and
// system time per POST, the handler's and the NATS server's: steadier than ns/op on a shared
// machine.
func BenchmarkAppend(b *testing.B) {
	gw := gateways(b, 1, Config{})
	h := handlerOf(gw[0])
	body := benchBody()
	var producers atomic.Int64
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.SetParallelism(25) // 50 producers on 2 cores
	b.ResetTimer()
	cpu0 := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		name := "bench-" + strconv.FormatInt(producers.Add(1), 10)
		put := httptest.NewRequest("PUT", "/v1/stream/"+name, nil)
		put.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, put)
		if rec.Code != http.StatusCreated {
			b.Errorf("PUT = %d %s", rec.Code, rec.Body)
			return
		}
		for seq := 0; pb.Next(); seq++ {
			req := httptest.NewRequest("POST", "/v1/stream/"+name, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Producer-Id", "p")
			req.Header.Set("Producer-Epoch", "0")
			req.Header.Set("Producer-Seq", strconv.Itoa(seq))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Errorf("POST seq %d = %d %s", seq, rec.Code, rec.Body)
				return
			}
		}
	})
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime returns the process's user and system time.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchBody is dsbench append's POST body: a JSON array of 32 objects of 1 KiB.
func benchBody() []byte {
	var elems []string
	for i := range 32 {
		head := fmt.Sprintf(`{"p":0,"i":%d,"pad":"`, i)
		elems = append(elems, head+strings.Repeat("x", 1024-len(head)-2)+`"}`)
	}
	return []byte("[" + strings.Join(elems, ",") + "]")
}

// BenchmarkCompactJSON compacts and validates benchBody with jsoncompact.Append and, for
// comparison, with json.Compact.
func BenchmarkCompactJSON(b *testing.B) {
	body := benchBody()
	out := make([]byte, 0, len(body))
	b.Run("jsoncompact.Append", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, ok := jsoncompact.Append(out[:0], body); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("json.Compact", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		buf := bytes.NewBuffer(out)
		for b.Loop() {
			buf.Reset()
			if err := json.Compact(buf, body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
