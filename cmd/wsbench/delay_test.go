package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayProxy: bytes go through unchanged and in order, and a round trip through the
// proxy takes at least twice its delay.
func TestDelayProxy(t *testing.T) {
	echo := serveLoopback(t, func(c net.Conn) { io.Copy(c, c); c.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { serveDelayed(ctx, ln, echo, 30*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := bytes.Repeat([]byte("0123456789"), 50_000)
	start := time.Now()
	go c.Write(want)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(start)
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes came back changed")
	}
	if rtt < 60*time.Millisecond {
		t.Fatalf("round trip through a 30ms proxy took %v, want at least 60ms", rtt)
	}
	t.Logf("500 kB round trip through a proxy delaying 30ms each way: %v", rtt.Round(time.Millisecond))
}

// serveLoopback listens on a loopback port until the test ends, handling each connection
// in its own goroutine; it returns the address.
func serveLoopback(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}
