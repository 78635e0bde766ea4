package conversation

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// MsgTooManyFollows is the message of the bare RUN_ERROR (code limit_exceeded) of a follow
// frame beyond Config.MaxFollowsPerSocket.
const MsgTooManyFollows = "max-follows: too many threads followed on this socket"

// threadQueryWait bounds how long a follow collects the answers of the gateways to its
// query for the thread's running runs: their number is not known.
const threadQueryWait = 2 * time.Second

// hub fans the announcements of the threads this gateway's sockets follow out to them: one
// NATS subscription per thread key that at least one socket follows.
type hub struct {
	mu   sync.Mutex
	subs map[string]*threadSub
}

// threadSub is the gateway's subscription to one thread's announcements and its followers.
type threadSub struct {
	unsubscribe func()
	followers   map[*follow]struct{}
}

// join adds f to its thread's followers, subscribing to the thread's announcements for the
// first one. The subscription is made before join returns, so a query sent afterwards
// misses no run.
func (s *Server) join(f *follow) error {
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if ts := h.subs[f.key]; ts != nil {
		ts.followers[f] = struct{}{}
		return nil
	}
	ts := &threadSub{followers: map[*follow]struct{}{f: {}}}
	key := f.key
	unsubscribe, err := s.cfg.Store.SubscribeThread(key, func(run Announcement) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.subs[key] != ts {
			return
		}
		for f := range ts.followers {
			f.offer(run)
		}
	})
	if err != nil {
		return err
	}
	ts.unsubscribe = unsubscribe
	if h.subs == nil {
		h.subs = make(map[string]*threadSub)
	}
	h.subs[key] = ts
	return nil
}

// leave removes f from its thread's followers, and the subscription with the last one.
func (s *Server) leave(f *follow) {
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := h.subs[f.key]
	if ts == nil {
		return
	}
	delete(ts.followers, f)
	if len(ts.followers) == 0 {
		delete(h.subs, f.key)
		ts.unsubscribe()
	}
}

// follows is what a conversation socket follows, and the runs it is sent from their logs
// (followed runs, and the rest of its own turns that another client aborted), allocated at
// the first (tasksOf).
type follows struct {
	mu       sync.Mutex
	closed   bool
	byThread map[string]*follow // by thread key
	wg       sync.WaitGroup     // the runs being delivered
	ctx      context.Context    // cancelled when the socket's reader stopped
	cancel   context.CancelFunc
}

// tasksOf returns the socket's follows, allocating them; nil once its reader stopped.
func (c *conn) tasksOf() *follows {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil
	}
	if c.follows == nil {
		ctx, cancel := context.WithCancel(context.Background())
		c.follows = &follows{ctx: ctx, cancel: cancel}
	}
	return c.follows
}

// catchUp sends the socket the rest of its own turn runID, which another client aborted: the
// turn delivers nothing live after an abort, so the log after the last offset delivered live
// (after, "" for none) is read and sent as envelopes naming the run, to its close.
func (c *conn) catchUp(runID, after string) {
	if after == "" {
		after = FromStart
	}
	fs := c.tasksOf()
	if fs == nil {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed {
		return
	}
	fs.wg.Add(1)
	go func() {
		defer fs.wg.Done()
		c.srv.replay(fs.ctx, c.principal, runID, after, c.logger(), nil, c.runSender(runID))
	}()
}

// runSender returns the replay's send function of a run delivered from its log: envelopes
// naming the run, each waiting for room in half the socket's queue (sendWithin), so that a
// replay faster than the socket never takes the room of its own turns' live frames. A socket
// that takes nothing for half the write timeout is closed 1013 "slow consumer", as a live
// frame's overflow closes it (and before the writer's own timeout would, without a code).
func (c *conn) runSender(runID string) func(ctx context.Context, offset string, event []byte) error {
	return func(ctx context.Context, offset string, event []byte) error {
		frame := protocol.AppendRunEnvelope(make([]byte, 0, len(event)+len(offset)+len(runID)+32), offset, event, runID)
		err := c.sendWithin(ctx, frame, 2, c.srv.cfg.WriteTimeout/2)
		if errors.Is(err, errNoRoom) {
			c.srv.cfg.Metrics.FrameDropped(metrics.DropSlowConsumer)
			c.logAttrs(slog.LevelInfo, "slow consumer: no room for a replay")
			c.requestClose(StatusSlowConsumer, "slow consumer", false)
			return errSocketClosed
		}
		return err
	}
}

// ownSink is the sink of a turn a conversation socket started: it remembers the offset of
// the last event delivered live (catchUp).
type ownSink struct {
	c    *conn
	mu   sync.Mutex
	last string
}

func (o *ownSink) Deliver(offset string, event []byte, emitted time.Time) {
	if offset != "" {
		o.mu.Lock()
		o.last = offset
		o.mu.Unlock()
	}
	o.c.Deliver(offset, event, emitted)
}

func (o *ownSink) lastOffset() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last
}

// follow is one socket's follow of one thread: it delivers each run of the thread, from
// its log's start to its close, once.
type follow struct {
	c        *conn
	key      string
	threadID string
	ctx      context.Context // cancelled by unfollow and when the socket closes
	cancel   context.CancelFunc

	// Guarded by the socket's follows.mu.
	active   map[string]struct{} // runs being delivered
	querying bool                // the query for the running runs is open
	recent   map[string]struct{} // runs delivered while querying: a late answer names them
}

// origin names the socket in announcements, so that it is not sent its own runs again.
func (c *conn) origin() string {
	return c.srv.origin + "-" + strconv.FormatUint(c.id, 36)
}

// originOf is the origin of a run started by owner (nil over HTTP: none).
func originOf(owner *conn) string {
	if owner == nil {
		return ""
	}
	return owner.origin()
}

// follow starts following the principal's thread threadID: the runs announced from now
// on, and those running now on any gateway, each from its start. Following a thread again
// changes nothing; a follow beyond Config.MaxFollowsPerSocket is refused with a bare
// RUN_ERROR.
func (c *conn) follow(threadID string) {
	key := c.srv.cfg.Store.ThreadKey(c.principal, threadID)
	fs := c.tasksOf()
	if fs == nil {
		return
	}
	fs.mu.Lock()
	if fs.closed || fs.byThread[key] != nil {
		fs.mu.Unlock()
		return
	}
	if len(fs.byThread) >= c.srv.cfg.MaxFollowsPerSocket {
		fs.mu.Unlock()
		c.logAttrs(slog.LevelDebug, "follow refused: max-follows")
		c.srv.cfg.Metrics.LimitRefused(metrics.LimitFollows)
		c.Deliver("", protocol.AppendRunError(nil, MsgTooManyFollows, CodeLimitExceeded), time.Time{})
		c.pause()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follow{c: c, key: key, threadID: threadID, ctx: ctx, cancel: cancel, active: map[string]struct{}{}, querying: true}
	if fs.byThread == nil {
		fs.byThread = make(map[string]*follow)
	}
	fs.byThread[key] = f
	if len(fs.byThread) == 1 {
		c.hb.TurnStarted() // a socket that follows a thread never idles out
	}
	fs.mu.Unlock()

	if err := c.srv.join(f); err != nil {
		c.logAttrs(slog.LevelWarn, "follow: subscribing to the thread", slog.String(keyErr, err.Error()))
		c.unfollowKey(key)
		c.Deliver("", protocol.AppendRunError(nil, "the thread cannot be followed now", CodeLogUnavailable), time.Time{})
		return
	}
	stop, err := c.srv.cfg.Store.QueryThread(key, threadQueryWait, func(runs []Announcement) {
		for _, run := range runs {
			f.offer(run)
		}
	})
	if err != nil {
		c.logAttrs(slog.LevelWarn, "follow: asking for the thread's running runs", slog.String(keyErr, err.Error()))
		f.endQuery()
		return
	}
	context.AfterFunc(ctx, stop)
	time.AfterFunc(threadQueryWait, f.endQuery)
}

// unfollow stops following the principal's thread threadID: the runs being delivered stop.
func (c *conn) unfollow(threadID string) {
	c.unfollowKey(c.srv.cfg.Store.ThreadKey(c.principal, threadID))
}

func (c *conn) unfollowKey(key string) {
	c.mu.Lock()
	fs := c.follows
	c.mu.Unlock()
	if fs == nil {
		return
	}
	fs.mu.Lock()
	f := fs.byThread[key]
	if f == nil {
		fs.mu.Unlock()
		return
	}
	delete(fs.byThread, key)
	if len(fs.byThread) == 0 {
		c.hb.TurnEnded()
	}
	fs.mu.Unlock()
	f.cancel()
	c.srv.leave(f)
}

// unfollowAll ends every follow of a socket whose reader stopped, and waits for their
// deliveries to stop.
func (c *conn) unfollowAll() {
	c.mu.Lock()
	fs := c.follows
	c.ended = true
	c.mu.Unlock()
	if fs == nil {
		return
	}
	fs.mu.Lock()
	fs.closed = true
	all := fs.byThread
	fs.byThread = nil
	fs.mu.Unlock()
	fs.cancel()
	for _, f := range all {
		f.cancel()
		c.srv.leave(f)
	}
	if len(all) > 0 {
		c.hb.TurnEnded()
	}
	fs.wg.Wait()
}

// offer delivers run unless the socket started it, or delivers or delivered it already
// (an announcement and a query's answers may all name it). A switch of the thread's active
// branch is sent as a thread.branch frame.
func (f *follow) offer(run Announcement) {
	c := f.c
	if run.Branch != "" {
		if f.ctx.Err() == nil {
			c.Deliver("", protocol.ThreadBranch(f.threadID, run.Branch), time.Time{})
		}
		return
	}
	if run.Origin != "" && run.Origin == c.origin() {
		return
	}
	fs := c.follows
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed || f.ctx.Err() != nil {
		return
	}
	if _, ok := f.active[run.RunID]; ok {
		return
	}
	if _, ok := f.recent[run.RunID]; ok {
		return
	}
	f.active[run.RunID] = struct{}{}
	fs.wg.Add(1)
	go f.deliver(run.RunID)
}

// endQuery closes the query's window: from now on only announcements name runs, once per
// start of a run.
func (f *follow) endQuery() {
	fs := f.c.follows
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f.querying, f.recent = false, nil
}

// deliver sends the run's log from its start to its close through the one replay path, as
// envelopes naming the run. Frames are queued as a turn's are: one that does not fit closes
// the socket 1013, and the client resumes the run by offset.
func (f *follow) deliver(runID string) {
	c := f.c
	fs := c.follows
	defer fs.wg.Done()
	c.srv.replay(f.ctx, c.principal, runID, FromStart, c.logger(), nil, c.runSender(runID))
	fs.mu.Lock()
	delete(f.active, runID)
	if f.querying {
		if f.recent == nil {
			f.recent = make(map[string]struct{})
		}
		f.recent[runID] = struct{}{}
	}
	fs.mu.Unlock()
}

// runningRuns answers a thread query: the runs of the thread key that this gateway runs,
// once announced.
func (s *Server) runningRuns(key string) []Announcement {
	r := &s.turns
	r.mu.Lock()
	defer r.mu.Unlock()
	var runs []Announcement
	for _, sl := range r.slots {
		if sl.thread == key && sl.announced {
			runs = append(runs, Announcement{RunID: sl.key.runID, Origin: originOf(sl.owner)})
		}
	}
	return runs
}
