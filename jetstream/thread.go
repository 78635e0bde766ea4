package jetstream

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	nats "github.com/nats-io/nats.go"
)

// Announcement is a run of a thread as announcements and thread queries carry it between the
// stores sharing the stream: its runId, and Origin, an opaque name the announcing process
// gave the client that started it ("" for none), so that a process can tell a client its own
// runs. An announcement of a switch of the thread's active branch names the message switched
// to in Branch, and no run.
type Announcement struct {
	RunID  string `json:"runId,omitempty"`
	Origin string `json:"origin,omitempty"`
	Branch string `json:"branch,omitempty"`
}

// hdrThread names the thread of a thread query (its ThreadKey).
const hdrThread = "Wsg-Thread"

// ThreadKey names the thread (principal, threadID) on the wire: a hash of the
// length-delimited pair, so neither travels and two principals never share a thread. It is
// a valid subject token.
func (s *Store) ThreadKey(principal, threadID string) string {
	return PairKey("thread", principal, threadID)
}

// threadSubject is the subject of the announcements of the thread key.
func (s *Store) threadSubject(key string) string { return s.cfg.ThreadPrefix + "." + key }

// querySubject is the subject of thread queries; no ThreadKey spells it.
func (s *Store) querySubject() string { return s.cfg.ThreadPrefix + ".query" }

// Announce tells every store sharing the stream that run of the thread key was accepted
// (SubscribeThread). It is sent once, at most once delivered, and does not wait.
func (s *Store) Announce(key string, run Announcement) error {
	b, err := json.Marshal(run)
	if err == nil {
		err = s.nc.Publish(s.threadSubject(key), b)
	}
	if err != nil {
		return fmt.Errorf("jetstream: announce a run: %w", err)
	}
	return nil
}

// SubscribeThread calls f with every run of the thread key announced from now on by any
// store sharing the stream, this one included, until unsubscribe is called. f runs on the
// connection's delivery goroutine: it must not block. A query (QueryThread) sent after
// SubscribeThread returns reaches the other stores after the subscription: a run is
// announced to it, or reported by the query, or both.
func (s *Store) SubscribeThread(key string, f func(Announcement)) (unsubscribe func(), err error) {
	sub, err := s.nc.Subscribe(s.threadSubject(key), func(m *nats.Msg) {
		var run Announcement
		if json.Unmarshal(m.Data, &run) == nil && (run.RunID != "" || run.Branch != "") {
			f(run)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: subscribe to a thread: %w", err)
	}
	return func() { sub.Unsubscribe() }, nil
}

// OnThreadQuery answers the thread queries of every store sharing the stream, this one's
// included: running returns the runs of the thread key that run in this process (nil for
// none, which is not answered). It runs on the connection's delivery goroutine: it must not
// block. The subscription lasts until Close.
func (s *Store) OnThreadQuery(running func(key string) []Announcement) error {
	_, err := s.nc.Subscribe(s.querySubject(), func(m *nats.Msg) {
		runs := running(m.Header.Get(hdrThread))
		if len(runs) == 0 || m.Reply == "" {
			return
		}
		if b, err := json.Marshal(runs); err == nil {
			s.nc.Publish(m.Reply, b)
		}
	})
	if err != nil {
		return fmt.Errorf("jetstream: subscribe to thread queries: %w", err)
	}
	return nil
}

// QueryThread asks every store sharing the stream which runs of the thread key run now, and
// calls f with each answer as it arrives, during wait: the number of stores is not known, so
// answers are collected for a bounded time. It returns at once; stop ends the query early.
// f runs on the connection's delivery goroutine: it must not block. A run may be reported by
// several answers.
func (s *Store) QueryThread(key string, wait time.Duration, f func([]Announcement)) (stop func(), err error) {
	inbox := s.nc.NewInbox()
	sub, err := s.nc.Subscribe(inbox, func(m *nats.Msg) {
		var runs []Announcement
		if json.Unmarshal(m.Data, &runs) == nil {
			f(runs)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: thread query: %w", err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { sub.Unsubscribe() }) }
	m := nats.NewMsg(s.querySubject())
	m.Reply = inbox
	m.Header.Set(hdrThread, key)
	if err := s.nc.PublishMsg(m); err != nil {
		stop()
		return nil, fmt.Errorf("jetstream: thread query: %w", err)
	}
	time.AfterFunc(wait, stop)
	return stop, nil
}
