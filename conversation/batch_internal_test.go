package conversation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// countingConn counts the writes that reach the connection (one system call each).
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// batchSocket is a server-side conn upgraded through a batchHijacker on loopback, with a
// coder/websocket client connected to it.
type batchSocket struct {
	c      *conn
	count  *countingConn
	client *websocket.Conn
}

// startBatchSocket upgrades one socket; the server side reads (answering pings and taking
// pongs) until the socket closes. writeTimeout is Config.WriteTimeout.
func startBatchSocket(t *testing.T, writeTimeout time.Duration) *batchSocket {
	t.Helper()
	got := make(chan *batchSocket, 1)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj := &batchHijacker{ResponseWriter: w}
		ws, err := websocket.Accept(hj, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		count := &countingConn{Conn: hj.conn.Conn}
		hj.conn.Conn = count // before the first write of the socket
		srv := &Server{cfg: Config{WriteTimeout: writeTimeout, QueueSize: 1 << 20, QueueBytes: 1 << 30}, log: slog.New(slog.DiscardHandler)}
		c := &conn{srv: srv, ws: ws, out: hj.conn}
		c.wg.Add(1)
		go func() { // the socket's reader
			defer c.wg.Done()
			for {
				if _, _, err := ws.Reader(context.Background()); err != nil {
					return
				}
			}
		}()
		got <- &batchSocket{c: c, count: count}
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs.Listener = l
	hs.Start()
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws://"+l.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	client.SetReadLimit(1 << 20)
	s := <-got
	s.client = client
	t.Cleanup(func() {
		client.CloseNow()
		s.c.ws.CloseNow()
		s.c.wg.Wait()
	})
	return s
}

// queueAll queues frames so that the writer takes them as one batch.
func (s *batchSocket) queueAll(frames [][]byte) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for _, f := range frames {
		s.c.pushLocked(frame{data: f})
	}
}

func testFrames(n, size int) [][]byte {
	frames := make([][]byte, n)
	for i := range frames {
		prefix := fmt.Sprintf("%d:", i)
		frames[i] = []byte(prefix + strings.Repeat("x", max(size-len(prefix), 0)))
	}
	return frames
}

// readFrames reads n text messages and checks them against want.
func readFrames(t *testing.T, client *websocket.Conn, want [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, w := range want {
		typ, got, err := client.Read(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if typ != websocket.MessageText || string(got) != string(w) {
			t.Fatalf("frame %d: got %v %.40q (%d bytes), want %.40q (%d bytes)", i, typ, got, len(got), w, len(w))
		}
	}
}

func TestBatchWrites(t *testing.T) {
	tests := []struct {
		name      string
		frames    [][]byte
		maxWrites int64 // system calls for the batch
	}{
		{"small frames", testFrames(200, 100), 1},
		{"one frame", testFrames(1, 10), 1},
		{"frames past the bound", testFrames(100, 1000), 4},
		{"frames larger than the bound", testFrames(3, 3*batchBufferSize), 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startBatchSocket(t, 10*time.Second)
			s.queueAll(tt.frames)
			readFrames(t, s.client, tt.frames)
			if n := s.count.writes.Load(); n > tt.maxWrites {
				t.Errorf("%d frames took %d writes, want at most %d", len(tt.frames), n, tt.maxWrites)
			}
			// The writer returns once the queue is written: the socket holds no buffer.
			s.c.requestClose(websocket.StatusNormalClosure, "done", true)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, _, err := s.client.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("after the frames: %v, want close 1000", err)
			}
			s.c.wg.Wait()
			s.c.out.mu.Lock()
			held := s.c.out.buf != nil
			s.c.out.mu.Unlock()
			if held {
				t.Error("the closed socket still holds a batch buffer")
			}
		})
	}
}

// TestBatchControlFrames pings the client from other goroutines while the writer streams
// batches: every ping must be answered (its frame was sent, at the latest at the end of the
// batch it fell into) and every data frame must arrive, in order, once.
func TestBatchControlFrames(t *testing.T) {
	s := startBatchSocket(t, 10*time.Second)
	const batches, perBatch = 200, 50
	var want [][]byte
	for b := range batches {
		for i := range perBatch {
			want = append(want, []byte(fmt.Sprintf("batch %d frame %d %s", b, i, strings.Repeat("y", 200))))
		}
	}
	done := make(chan error, 1)
	go func() {
		for b := range batches {
			s.queueAll(want[b*perBatch : (b+1)*perBatch])
			time.Sleep(100 * time.Microsecond)
		}
		done <- nil
	}()
	pings := make(chan error, 1)
	go func() {
		var err error
		for range 100 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = errors.Join(err, s.c.ws.Ping(ctx))
			cancel()
		}
		pings <- err
	}()
	readFrames(t, s.client, want)
	<-done
	// The client answers pings while it reads: keep reading (nothing more is sent) until the
	// pings are done.
	readCtx, stopRead := context.WithCancel(context.Background())
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		_, _, _ = s.client.Read(readCtx)
	}()
	err := <-pings
	stopRead()
	<-reading
	if err != nil {
		t.Fatalf("ping during batches: %v", err)
	}
	if n := s.count.writes.Load(); n >= int64(len(want)) {
		t.Errorf("%d frames took %d writes: not batched", len(want), n)
	}
}

// TestBatchWriteDeadline checks that a peer that stops reading fails the batch within the
// write timeout: the writer closes the socket instead of blocking.
func TestBatchWriteDeadline(t *testing.T) {
	s := startBatchSocket(t, 200*time.Millisecond)
	// The client never reads: the kernel buffers fill up and a flush blocks.
	big := testFrames(64, 256<<10)
	s.queueAll(big)
	stopped := make(chan struct{})
	go func() {
		s.c.wg.Wait() // the writer and the reader return once the socket is closed
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the writer is still blocked on a peer that does not read")
	}
	s.c.mu.Lock()
	closed := s.c.gone && s.c.closing
	s.c.mu.Unlock()
	if !closed {
		t.Error("the timed-out socket is not marked closed")
	}
}
