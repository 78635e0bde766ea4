package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// delayProxyMain forwards TCP connections from --listen to --target, holding every chunk of
// bytes --delay in each direction before it goes on (so a round trip through it takes
// 2×delay more), without limiting throughput: chunks are pipelined, each leaves delay after
// it arrived. It runs until interrupted. For a gateway whose NATS is far away:
//
//	wsbench delay-proxy --listen 127.0.0.1:14222 --target 127.0.0.1:4222 --delay 10ms
func delayProxyMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench delay-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to accept connections on")
	target := fs.String("target", "", "address to forward them to (required)")
	delay := fs.Duration("delay", 10*time.Millisecond, "time every chunk is held, in each direction")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *target == "" || *delay < 0 {
		fmt.Fprintln(stderr, "wsbench delay-proxy: --target is required and --delay must not be negative")
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench delay-proxy:", err)
		return 1
	}
	fmt.Fprintf(stdout, "delay-proxy %s -> %s, %v each way\n", ln.Addr(), *target, *delay)
	serveDelayed(ctx, ln, *target, *delay)
	return 0
}

// serveDelayed accepts on ln until ctx ends, then closes ln and every connection.
func serveDelayed(ctx context.Context, ln net.Listener, target string, delay time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			t, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer t.Close()
			done := context.AfterFunc(ctx, func() { c.Close(); t.Close() })
			defer done()
			var pair sync.WaitGroup
			pair.Add(2)
			go func() { defer pair.Done(); forwardDelayed(t, c, delay) }()
			go func() { defer pair.Done(); forwardDelayed(c, t, delay) }()
			pair.Wait()
		}()
	}
}

// forwardDelayed copies src to dst, each chunk delay after it was read, until either ends;
// then it closes both, so that the other direction ends too.
func forwardDelayed(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range q { // the reader ends with src
	}
}
