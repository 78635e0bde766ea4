package jetstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// maxStreams bounds Config.Streams.
const maxStreams = 64

// shard is one of the streams the runs' logs are spread over.
type shard struct {
	index  int
	stream natsjs.Stream
	prefix string // a run's subject is prefix.<log key>
	epoch  string // tells offsets of this stream from those of an earlier one of its name
}

// subject returns the subject of (principal, runID)'s log on sh, and the tag of its offsets.
func (sh *shard) subject(principal, runID string) (subject, tag string) {
	k := logKey(principal, runID)
	return sh.prefix + "." + k, offsetTag(sh.epoch, k)
}

// shardNames returns the name of stream i and its subjects' prefix: stream 0 keeps the
// names of a store with one stream.
func (s *Store) shardNames(i int) (name, prefix string) {
	if i == 0 {
		return s.cfg.Stream, s.cfg.SubjectPrefix
	}
	return s.cfg.Stream + "_" + strconv.Itoa(i), s.cfg.SubjectPrefix + "-" + strconv.Itoa(i)
}

// place returns the stream a new run of key goes to.
func (s *Store) place(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(s.cfg.Streams))
}

// shard returns stream i, opening it when a run created with more streams than this store's
// is on it.
func (s *Store) shard(ctx context.Context, i int) (*shard, error) {
	s.mu.Lock()
	sh := s.shards[i]
	s.mu.Unlock()
	if sh != nil {
		return sh, nil
	}
	if i < 0 || i >= maxStreams {
		return nil, fmt.Errorf("stream %d out of 0..%d", i, maxStreams-1)
	}
	name, prefix := s.shardNames(i)
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	sh = &shard{index: i, stream: st, prefix: prefix, epoch: st.CachedInfo().Config.Metadata[epochMetaKey]}
	s.mu.Lock()
	s.shards[i] = sh
	s.mu.Unlock()
	return sh, nil
}

// knownTag reports whether tag is that of key's offsets on one of the streams this store
// has open.
func (s *Store) knownTag(tag, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range s.shards {
		if tag == offsetTag(sh.epoch, key) {
			return true
		}
	}
	return false
}

// ensureShard creates or updates stream i and learns its epoch.
func (s *Store) ensureShard(ctx context.Context, i int) (*shard, error) {
	name, prefix := s.shardNames(i)
	want := natsjs.StreamConfig{
		Name:       name,
		Subjects:   []string{prefix + ".>"},
		Storage:    natsjs.FileStorage,
		Retention:  natsjs.LimitsPolicy,
		Discard:    natsjs.DiscardOld,
		MaxAge:     s.cfg.Retention,
		Duplicates: s.cfg.DedupWindow,
		Replicas:   s.cfg.Replicas,
		// Message gets go to the stream's leader. Direct gets may be answered by a
		// replica that has not applied the last writes yet: a resume from an offset just
		// acknowledged would be refused as past the end, and a publish retry could miss
		// its own stored message.
		AllowDirect: false,
	}
	for attempt := 0; attempt < 5; attempt++ {
		st, err := s.js.Stream(ctx, name)
		if errors.Is(err, natsjs.ErrStreamNotFound) {
			cfg := want
			cfg.Metadata = map[string]string{epochMetaKey: randomHex(8)}
			st, err = s.js.CreateStream(ctx, cfg)
			if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		have := st.CachedInfo().Config
		cfg := want
		cfg.Metadata = map[string]string{}
		for k, v := range have.Metadata {
			if !strings.HasPrefix(k, "_nats") {
				cfg.Metadata[k] = v
			}
		}
		if cfg.Metadata[epochMetaKey] == "" {
			cfg.Metadata[epochMetaKey] = randomHex(8)
		}
		if have.Metadata[epochMetaKey] != cfg.Metadata[epochMetaKey] || have.MaxAge != want.MaxAge ||
			have.Duplicates != want.Duplicates || have.Replicas != want.Replicas ||
			have.AllowDirect != want.AllowDirect || len(have.Subjects) != 1 || have.Subjects[0] != want.Subjects[0] {
			if st, err = s.js.UpdateStream(ctx, cfg); err != nil {
				return nil, fmt.Errorf("update stream %s: %w", name, err)
			}
		}
		return &shard{index: i, stream: st, prefix: prefix, epoch: st.CachedInfo().Config.Metadata[epochMetaKey]}, nil
	}
	return nil, fmt.Errorf("stream %s: concurrent changes", name)
}

// spreadLeaders asks the streams' leaders to move so that no node leads two streams while
// another replica's node leads none: JetStream elects each stream's leader by itself, and
// the point of several streams is to spread their writes over the nodes. It is best
// effort: a failed move leaves the placement as it was, and the streams work anyway.
func (s *Store) spreadLeaders(ctx context.Context) {
	if s.cfg.Streams < 2 || s.cfg.Replicas < 2 {
		return
	}
	leads := map[string]int{} // node: streams it leads
	infos := make([]*natsjs.StreamInfo, s.cfg.Streams)
	for i := range s.cfg.Streams {
		sh, err := s.shard(ctx, i)
		if err != nil {
			return
		}
		info, err := sh.stream.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return
		}
		infos[i] = info
		leads[info.Cluster.Leader]++
	}
	for _, info := range infos {
		leader := info.Cluster.Leader
		if leads[leader] < 2 {
			continue
		}
		for _, peer := range info.Cluster.Replicas {
			if peer.Offline || !peer.Current || leads[peer.Name] > 0 {
				continue
			}
			req := mustJSON(map[string]any{"placement": map[string]string{"preferred": peer.Name}})
			if _, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+info.Config.Name, req); err != nil {
				s.log.Warn("jetstream: moving a stream's leader", "stream", info.Config.Name, "to", peer.Name, keyErr, err)
				break
			}
			s.log.Info("jetstream: moved a stream's leader to spread the streams' leaders over the nodes", "stream", info.Config.Name, "from", leader, "to", peer.Name)
			leads[leader]--
			leads[peer.Name]++
			break
		}
	}
}
