package conversation

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// Close codes of the gateway besides the standard ones.
const (
	// StatusUnknownRun closes a resume socket whose run does not exist for the principal.
	StatusUnknownRun websocket.StatusCode = 4404
	// StatusSlowConsumer closes a socket whose outbound queue overflowed (1013, "try again
	// later": the client resumes from the log).
	StatusSlowConsumer = websocket.StatusTryAgainLater
)

// errSocketClosed is returned to a producer waiting for room on a closed socket.
var errSocketClosed = errors.New("conversation: socket closed")

// frame is one queued outbound text frame.
type frame struct {
	data    []byte
	emitted time.Time // zero for frames that are not events (pings, bare errors)
}

// conn is one socket. Its reader reads (a goroutine, which a conversation socket hands on
// to a new one after each frame: idle.go); the writer goroutine, started on demand, writes
// the queue and performs the close.
type conn struct {
	srv       *Server
	ws        *websocket.Conn
	principal string
	remote    string // the client's address, for log lines
	hb        *heartbeat.Entry

	mu      sync.Mutex
	queue   []frame
	queued  int  // bytes in queue
	writing bool // the writer goroutine runs
	pinging bool // a protocol ping waits for its pong
	// closing: a close was requested, no frame is accepted any more. The writer performs it
	// once the queue is written (flush) or at once.
	closing bool
	flush   bool
	abrupt  bool // close without handshake
	// gone: the reader is returning, or the writer closing: no goroutine may start.
	gone        bool
	resume      bool // a resume socket (else a conversation socket); set once
	ended       bool // the reader stopped: no follow or catch-up starts (follow.go)
	closeCode   websocket.StatusCode
	closeReason string
	room        chan struct{} // closed when the writer takes frames, for a waiting producer
	wg          sync.WaitGroup
	// out is the socket's connection, upgraded through a batchHijacker: the writer sends
	// each batch of queued frames with one system call per batchBufferSize bytes.
	out *batchConn

	// id names the socket in this process (origin).
	id uint64
	// expires: a resume socket's token expiry, after which its aborts are refused; zero:
	// none. A conversation socket's is its heartbeat deadline. Set once.
	expires time.Time

	// Conversation sockets only. turnCount and early are guarded by the registry's mu.
	follows   *follows        // the threads it follows, from its first follow frame; under mu
	turnCount int             // keys of the registry whose slot this socket owns
	early     earlyAborts     // aborts that came before their run frame
	runFrames quota.Bucket    // run frames taken (Config.RunFrameRate); reader only
	turnCtx   context.Context // values for its turns' agents (Config.TurnContext) or its replay (a trace context); nil: none
}

// newConn returns the socket ws, upgraded through a batchHijacker whose connection is out,
// of a client at remote. out is set before the socket joins the heartbeat wheel, whose pings
// start the writer.
func newConn(s *Server, ws *websocket.Conn, out *batchConn, kind metrics.SocketKind, principal, remote string) *conn {
	c := &conn{srv: s, ws: ws, out: out, resume: kind == metrics.SocketResume, principal: principal, remote: remote, id: s.connIDs.Add(1)}
	c.hb = s.wheel.Add(c)
	return c
}

// kind returns the socket's kind.
func (c *conn) kind() metrics.SocketKind {
	if c.resume {
		return metrics.SocketResume
	}
	return metrics.SocketConversation
}

// logAttrs logs msg at level with the socket's attributes (kind and remote), then attrs.
// The socket holds no logger of its own: With would keep the attributes, formatted, for the
// socket's life.
func (c *conn) logAttrs(level slog.Level, msg string, attrs ...slog.Attr) {
	ctx := context.Background()
	if log := c.srv.log; log.Enabled(ctx, level) {
		log.LogAttrs(ctx, level, msg, append(c.attrs(), attrs...)...)
	}
}

// logger returns a logger with the socket's attributes, for a turn or a replay.
func (c *conn) logger() *slog.Logger {
	return slog.New(c.srv.log.Handler().WithAttrs(c.attrs()))
}

// attrs returns the socket's log attributes.
func (c *conn) attrs() []slog.Attr {
	return []slog.Attr{slog.String(keyKind, string(c.kind())), slog.String(keyRemote, c.remote)}
}

// Deliver queues a turn's event as an envelope {"id":offset,"chunk":event}, or a bare event
// as it is, without blocking (turn.Sink). A frame that does not fit closes the socket 1013
// "slow consumer"; the turn is unaffected.
func (c *conn) Deliver(offset string, event []byte, emitted time.Time) {
	data := event
	if offset != "" {
		data = protocol.AppendEnvelope(make([]byte, 0, len(event)+len(offset)+20), offset, event)
	}
	c.deliverFrame(data, emitted)
}

// deliverFrame queues a frame without blocking and reports whether it was queued; one that
// does not fit closes the socket 1013 "slow consumer".
func (c *conn) deliverFrame(data []byte, emitted time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	if !c.roomLocked(len(data)) {
		c.srv.cfg.Metrics.FrameDropped(metrics.DropSlowConsumer)
		c.logAttrs(slog.LevelInfo, "slow consumer", slog.Int(keyQueued, len(c.queue)), slog.Int(keyBytes, c.queued))
		c.requestCloseLocked(StatusSlowConsumer, "slow consumer", false)
		return false
	}
	c.pushLocked(frame{data: data, emitted: emitted})
	return true
}

// roomLocked reports whether a frame of n bytes fits in the queue, and in the gateway's
// memory budget. An empty queue takes any frame, so a frame larger than the byte budget
// still goes out.
func (c *conn) roomLocked(n int) bool {
	if len(c.queue) == 0 {
		return true
	}
	return len(c.queue) < c.srv.cfg.QueueSize && c.queued+n <= c.srv.cfg.QueueBytes && !c.srv.cfg.Budget.Full()
}

// frameQueues holds the arrays of written batches: the writer gives back the array of each
// batch it wrote, and a frame queued on an empty queue, on any socket, takes one, where each
// batch grew its own (6 % of the bytes the gateway allocated in the throughput scenario,
// BENCHMARKS.md). An idle socket holds none.
var frameQueues = sync.Pool{New: func() any { return new([]frame) }}

// maxPooledFrames is the largest array a written batch gives back to frameQueues.
const maxPooledFrames = 2048

// pushLocked queues f, charged to the memory budget until it is written or dropped.
func (c *conn) pushLocked(f frame) {
	if c.queue == nil {
		c.queue = *frameQueues.Get().(*[]frame)
	}
	c.queue = append(c.queue, f)
	c.queued += len(f.data)
	c.srv.cfg.Budget.Take(int64(len(f.data)))
	c.startWriterLocked()
}

// dropQueueLocked drops the queued frames and gives their bytes back to the budget.
func (c *conn) dropQueueLocked() {
	c.srv.cfg.Budget.Release(int64(c.queued))
	c.queue, c.queued = nil, 0
}

// send queues a frame, waiting for room while the queue is full, or the gateway's memory
// budget has no room (resume sockets).
func (c *conn) send(ctx context.Context, data []byte) error {
	return c.sendWithin(ctx, data, 1, 0)
}

// errNoRoom is sendWithin's answer when the queue had no room for its wait.
var errNoRoom = errors.New("conversation: no room in the socket's queue")

// sendWithin queues a frame, waiting first while the memory budget has no room, then for
// room while the queue holds 1/share of its caps or more, for at most wait (0: no bound),
// then errNoRoom. A conversation socket's replays (follows, catch-ups) take half (share 2):
// they read a log faster than the socket writes, and the other half stays for its live
// turns, whose frames never wait.
func (c *conn) sendWithin(ctx context.Context, data []byte, share int, wait time.Duration) error {
	if err := c.srv.cfg.Budget.Wait(ctx, nil, c.srv.cfg.Budget.Room); err != nil {
		return err
	}
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		if c.closing {
			c.mu.Unlock()
			return errSocketClosed
		}
		if len(c.queue) == 0 || (len(c.queue) < c.srv.cfg.QueueSize/share && c.queued+len(data) <= c.srv.cfg.QueueBytes/share) {
			c.pushLocked(frame{data: data})
			c.mu.Unlock()
			return nil
		}
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.mu.Unlock()
		if wait > 0 && timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-room:
		case <-timeout:
			return errNoRoom
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Ping sends the heartbeat frame and a protocol ping (heartbeat.Peer). A full queue drops the
// heartbeat frame; the protocol ping still goes out.
func (c *conn) Ping() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	if c.roomLocked(len(protocol.PingFrame)) {
		c.pushLocked(frame{data: protocol.PingFrame})
	} else {
		c.srv.cfg.Metrics.FrameDropped(metrics.DropPingQueue)
	}
	if !c.pinging {
		c.pinging = true
		c.wg.Add(1)
		go c.protocolPing()
	}
}

// protocolPing waits for the pong of one protocol ping; the heartbeat wheel decides when an
// unanswered ping means a dead peer. The ping has no context deadline, which would cost a
// timer, a context and coder/websocket's AfterFunc per ping of every socket: its write is
// bounded by the connection's write timeout (batchConn.Write), and the wait for the pong by
// the wheel, whose Expire(Dead) closes the socket, which ends the wait.
func (c *conn) protocolPing() {
	defer c.wg.Done()
	err := c.ws.Ping(context.Background())
	c.mu.Lock()
	c.pinging = false
	c.mu.Unlock()
	if err == nil {
		c.hb.Pong()
	}
}

// Expire closes the socket for the heartbeat (heartbeat.Peer).
func (c *conn) Expire(r heartbeat.Reason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logAttrs(slog.LevelDebug, "heartbeat close", slog.String(keyReason, r.String()))
	if r == heartbeat.Deadline {
		c.expireTokenLocked()
		return
	}
	if r == heartbeat.Dead {
		c.abrupt = true
		c.requestCloseLocked(websocket.StatusGoingAway, "no pong", false)
		return
	}
	c.requestCloseLocked(websocket.StatusNormalClosure, "idle", false)
}

// requestClose asks the writer to close the socket with code and reason; with flush, after
// the queued frames. The first request wins.
func (c *conn) requestClose(code websocket.StatusCode, reason string, flush bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requestCloseLocked(code, reason, flush)
}

func (c *conn) requestCloseLocked(code websocket.StatusCode, reason string, flush bool) {
	if c.closing {
		return
	}
	c.closing = true
	c.closeCode, c.closeReason, c.flush = code, reason, flush
	if !flush {
		c.dropQueueLocked()
	}
	if c.room != nil {
		close(c.room)
		c.room = nil
	}
	c.startWriterLocked()
}

func (c *conn) startWriterLocked() {
	if c.writing || c.gone {
		return
	}
	c.writing = true
	c.wg.Add(1)
	go c.writeLoop()
}

// writeLoop writes queued frames until the queue is empty, then performs a requested close,
// and returns. It is the only goroutine that writes data frames or closes the socket.
func (c *conn) writeLoop() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.writing = false
			if !c.closing {
				c.mu.Unlock()
				return
			}
			code, reason, abrupt := c.closeCode, c.closeReason, c.abrupt
			c.gone = true // nothing more to write, and no writer to start
			c.mu.Unlock()
			c.close(code, reason, abrupt)
			return
		}
		batch, size := c.queue, int64(c.queued)
		c.queue, c.queued = nil, 0
		if c.room != nil {
			close(c.room)
			c.room = nil
		}
		c.mu.Unlock()
		err := c.writeBatch(batch)
		c.srv.cfg.Budget.Release(size) // held until written
		if cap(batch) <= maxPooledFrames {
			clear(batch) // the pool keeps no frame
			batch = batch[:0]
			frameQueues.Put(&batch)
		}
		if err != nil {
			c.mu.Lock()
			c.dropQueueLocked()
			c.closing, c.writing, c.gone = true, false, true
			c.mu.Unlock()
			c.ws.CloseNow()
			return
		}
	}
}

// writeBatch writes the frames taken from the queue under one write deadline
// (Config.WriteTimeout), stopping early when a close without flush is requested meanwhile.
// The frames leave in one system call per batchBufferSize bytes, and coder/websocket gets a
// context without deadline, so it arms no timer per frame. A lone frame that fits
// coder/websocket's write buffer with its header (a heartbeat frame, most often) leaves in
// one system call anyway: it takes no batch buffer, and the write has the connection's
// timeout of writes outside a batch.
func (c *conn) writeBatch(batch []frame) error {
	batched := len(batch) > 1 || len(batch[0].data) > batchWriteBufferSize-maxFrameHeader
	if batched {
		c.out.begin(time.Now().Add(c.srv.cfg.WriteTimeout))
	}
	ctx := context.Background()
	var err error
	n := 0
	for _, f := range batch {
		c.mu.Lock()
		drop := c.closing && !c.flush
		c.mu.Unlock()
		if drop {
			break
		}
		if err = c.ws.Write(ctx, websocket.MessageText, f.data); err != nil {
			break
		}
		n++
	}
	if batched {
		if endErr := c.out.end(); err == nil {
			err = endErr
		}
	}
	if err != nil {
		return err
	}
	now := time.Now()
	for _, f := range batch[:n] {
		if !f.emitted.IsZero() {
			c.srv.cfg.Metrics.Delivered(now.Sub(f.emitted))
		}
	}
	return nil
}

// close closes the socket, with a close handshake unless abrupt. The writer calls it once it
// set gone: the handshake reads the socket's read buffer, which awaitInput looks at only
// before gone.
func (c *conn) close(code websocket.StatusCode, reason string, abrupt bool) {
	if abrupt {
		c.ws.CloseNow()
		return
	}
	err := c.ws.Close(code, reason)
	if err != nil && websocket.CloseStatus(err) == -1 {
		c.logAttrs(slog.LevelDebug, "close handshake", slog.Int(keyCode, int(code)), slog.String(keyErr, err.Error()))
	}
}

// errTooBig ends a read whose message passed Config.ReadLimit.
var errTooBig = errors.New("conversation: message over the read limit")

// read returns the socket's next message whole; errTooBig, the rest of it unread, once it
// passes Config.ReadLimit; errParked when a control frame was read meanwhile (idle.go).
// The limit is the gateway's, not coder/websocket's (serve sets the library's off): the
// library answers from the reader's goroutine with a close frame of its own, which could land
// in a batch the writer had not flushed yet, or behind frames the kernel had not sent, when the
// reader's close of the connection lost it.
func (c *conn) read() (websocket.MessageType, []byte, error) {
	typ, r, err := c.next()
	if err != nil {
		return typ, nil, err
	}
	limit := c.srv.cfg.ReadLimit
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && int64(len(data)) > limit {
		return typ, nil, errTooBig
	}
	return typ, data, err
}

// finish ends the socket after its reader stopped with err: it closes the connection if
// nothing did, stops the heartbeat and waits for the socket's goroutines. After a message over
// the read limit (errTooBig) the writer closes the socket 1009 with the close handshake: the
// close frame follows the batch it is writing, then the rest of the message is read and
// dropped until the client's close frame (at most 5 s each, coder/websocket's Close). Closing
// the connection at once, the message unread, would reset it, and a reset drops what the
// kernel has not sent yet, the close frame with it: the client would see 1006.
func (c *conn) finish(err error) {
	tooBig := errors.Is(err, errTooBig)
	c.mu.Lock()
	if tooBig {
		c.requestCloseLocked(websocket.StatusMessageTooBig, "message too big", false)
	}
	if !c.closing {
		c.closing, c.abrupt = true, true
	}
	c.gone = true
	c.dropQueueLocked()
	if c.room != nil {
		close(c.room)
		c.room = nil
	}
	c.mu.Unlock()
	c.hb.Remove()
	if !tooBig {
		c.ws.CloseNow()
	}
	c.wg.Wait()
}
