package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// acks receives the acknowledgements of one publisher's messages on an inbox of its own (of
// one publisher at a time: a writer's inbox goes to another writer once released). The
// connection's reader puts each answer straight into a channel: no request multiplexer, no
// goroutine between the reader and the publisher, no context or timer made per publish (a
// run's writer publishes one event at a time when its agent is slow, and every hand-off
// shows in the delivery latency). It is not safe for concurrent use: a writer publishes one
// message at a time.
type acks struct {
	s     *Store
	nc    *nats.Conn
	inbox string
	ch    chan *nats.Msg // a few answers of attempts given up on fit before the current one
	sub   *nats.Subscription
	n     uint64 // attempts sent: attempt k is answered on inbox.k
	// late counts the attempts given up on whose answer has not been read: answers that may
	// still come. nats.go drops what a full channel cannot take, so there are never more of
	// them than leave room for the current attempt's answer: past that, publish moves to a
	// new inbox, and late answers go to the old one, unsubscribed.
	late  int
	timer *time.Timer
}

// acksBuffer is the capacity of an inbox's channel.
const acksBuffer = 8

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Error    *natsjs.APIError `json:"error,omitempty"`
	Stream   string           `json:"stream"`
	Sequence uint64           `json:"seq"`
}

// maxIdleAcks bounds the inboxes a store keeps subscribed for its next writers.
const maxIdleAcks = 1024

// newAcks returns an inbox a writer released, or subscribes to a new one. Release hands it
// back.
func (s *Store) newAcks() (*acks, error) {
	s.mu.Lock()
	if n := len(s.idleAcks); n > 0 {
		a := s.idleAcks[n-1]
		s.idleAcks[n-1] = nil
		s.idleAcks = s.idleAcks[:n-1]
		s.mu.Unlock()
		return a, nil
	}
	s.mu.Unlock()
	a := &acks{s: s, nc: s.nc}
	if err := a.subscribe(); err != nil {
		return nil, err
	}
	return a, nil
}

// subscribe moves a to a new inbox, with a new channel, and unsubscribes the old one.
func (a *acks) subscribe() error {
	inbox, ch := a.nc.NewInbox(), make(chan *nats.Msg, acksBuffer)
	sub, err := a.nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return fmt.Errorf("acknowledgement inbox: %w", err)
	}
	if a.sub != nil {
		a.sub.Unsubscribe()
	}
	a.inbox, a.ch, a.sub, a.late = inbox, ch, sub, 0
	return nil
}

// publish sends msg and waits up to timeout for its acknowledgement, returning the stored
// sequence. Errors are JetStream's refusals (*natsjs.APIError), nats.ErrNoResponders,
// nats.ErrTimeout, the connection's publish errors or ctx's.
func (a *acks) publish(ctx context.Context, msg *nats.Msg, timeout time.Duration) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err // nothing sent: its answer could race ctx's end below
	}
	// The late answers already in are read; if more may still come than the channel has
	// room for besides this attempt's answer, this attempt goes to a new inbox.
	for drained := false; !drained; {
		select {
		case <-a.ch:
			a.late = max(a.late-1, 0)
		default:
			drained = true
		}
	}
	if a.late >= acksBuffer-1 {
		if err := a.subscribe(); err != nil {
			return 0, err
		}
	}
	a.n++
	msg.Reply = a.inbox + "." + strconv.FormatUint(a.n, 10)
	if err := a.nc.PublishMsg(msg); err != nil {
		return 0, err
	}
	if a.timer == nil {
		a.timer = time.NewTimer(timeout)
	} else {
		a.timer.Reset(timeout)
	}
	defer a.timer.Stop()
	for {
		select {
		case m := <-a.ch:
			if m.Subject != msg.Reply {
				a.late = max(a.late-1, 0)
				continue // the late answer of an attempt given up on
			}
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return 0, nats.ErrNoResponders
			}
			var ack pubAck
			if err := json.Unmarshal(m.Data, &ack); err != nil {
				return 0, fmt.Errorf("publish acknowledgement: %w", err)
			}
			if ack.Error != nil {
				return 0, ack.Error
			}
			if ack.Stream == "" {
				return 0, natsjs.ErrInvalidJSAck
			}
			return ack.Sequence, nil
		case <-a.timer.C:
			a.late++
			return 0, nats.ErrTimeout
		case <-ctx.Done():
			a.late++
			return 0, ctx.Err()
		}
	}
}

// release keeps the inbox subscribed for the store's next writer (up to maxIdleAcks of
// them), or unsubscribes it. A subscription and its removal each cost the NATS server a walk
// of its cache of published subjects, full of runs' subjects and reply inboxes: with an inbox
// of its own per run, that was a fifth of the gateway's CPU when turns are short. Late
// answers of the previous writer's abandoned attempts are told apart by their attempt number,
// which goes on counting. release does nothing on a nil *acks.
func (a *acks) release() {
	if a == nil {
		return
	}
	s := a.s
	s.mu.Lock()
	if !s.closed && len(s.idleAcks) < maxIdleAcks {
		s.idleAcks = append(s.idleAcks, a)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	a.sub.Unsubscribe()
}
