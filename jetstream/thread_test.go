package jetstream

import (
	"slices"
	"testing"
	"time"
)

// TestThreadAnnouncementsAndQueries: two stores on one server. A run announced by either
// reaches the subscribers of its thread on both, never those of the same threadId of
// another principal, and nothing after unsubscribe; a query from one store is answered by
// every store that runs runs of the thread.
func TestThreadAnnouncementsAndQueries(t *testing.T) {
	a := openStore(t, testConfig(t))
	cfg := testConfig(t)
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg)

	key := a.ThreadKey("alice", "t1")
	if key != b.ThreadKey("alice", "t1") {
		t.Fatal("ThreadKey differs between stores")
	}
	for _, other := range []string{a.ThreadKey("bob", "t1"), a.ThreadKey("alice", "t2"), a.ThreadKey("alic", "et1")} {
		if other == key {
			t.Fatalf("ThreadKey(alice, t1) = ThreadKey of another thread: %s", key)
		}
	}

	got := make(chan Announcement, 10)
	unsubscribe, err := b.SubscribeThread(key, func(r Announcement) { got <- r })
	if err != nil {
		t.Fatal(err)
	}
	foreign := make(chan Announcement, 10)
	unsubForeign, err := b.SubscribeThread(b.ThreadKey("bob", "t1"), func(r Announcement) { foreign <- r })
	if err != nil {
		t.Fatal(err)
	}
	defer unsubForeign()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{a, b} {
		if err := s.Announce(key, Announcement{RunID: "r1", Origin: "o1"}); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r != (Announcement{RunID: "r1", Origin: "o1"}) {
				t.Fatalf("announcement = %+v", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no announcement within 10s")
		}
	}
	unsubscribe()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a.Announce(key, Announcement{RunID: "r2"})
	// A marker on the foreign thread, announced after r2 on the same connection, arrives
	// after r2 would have.
	a.Announce(a.ThreadKey("bob", "t1"), Announcement{RunID: "marker"})
	select {
	case r := <-foreign:
		if r.RunID != "marker" {
			t.Fatalf("another principal's thread got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no marker within 10s")
	}
	if len(got) != 0 || len(foreign) != 0 {
		t.Fatalf("after unsubscribe: %d announcements; another principal's thread: %d", len(got), len(foreign))
	}

	for i, s := range []*Store{a, b} {
		run := Announcement{RunID: []string{"ra", "rb"}[i]}
		if err := s.OnThreadQuery(func(k string) []Announcement {
			if k == key {
				return []Announcement{run}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.nc.Flush()
	}
	answers := make(chan []Announcement, 10)
	if _, err := a.QueryThread(key, 5*time.Second, func(rs []Announcement) { answers <- rs }); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for len(ids) < 2 {
		select {
		case rs := <-answers:
			for _, r := range rs {
				ids = append(ids, r.RunID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("answers within 10s: %v, want ra and rb", ids)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"ra", "rb"}) {
		t.Fatalf("answers = %v, want ra and rb", ids)
	}
	stop, err := b.QueryThread(b.ThreadKey("bob", "t1"), time.Second, func(rs []Announcement) { answers <- rs })
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the query's window
	stop()
	if len(answers) != 0 {
		t.Fatalf("a thread nobody runs got answers: %v", <-answers)
	}
}
