// Package jetstream keeps every run's event log on NATS JetStream: append with group commit
// and fencing, read and tail from an offset, run metadata, the closing or takeover of the
// runs whose producer is gone, retention, abort requests between gateways, and the embedded
// nats-server used when no external one is configured. The producer leases, the store's
// liveness key and the judgement of which leases expired are package lease's
// (jetstream/lease), which hands each lease it claims back to the store (reaper.go).
//
// # API
//
//   - Open(ctx, Config) connects (or starts an embedded server under Config.DataDir) and
//     creates or updates the stream and the two KV buckets. Store.Ready serves /readyz;
//     Store.Close stops what Open started and deletes the store's liveness key, so that
//     reapers end the runs it left open at once.
//   - Store.Create starts a run's log (a new generation of it on a resubmit by the same
//     principal) and returns its Writer: Append queues one event and reports its offset
//     through a callback once stored; WaitRoom waits while too much waits to be stored;
//     Close writes the close record; Lost fires when the writer was fenced out or lost its
//     lease.
//   - Store.Read returns a Reader of the events strictly after an offset (or FromStart,
//     FromNow): Next blocks while the log is open and returns io.EOF after the close; After
//     is the offset it reads after, FromNow resolved. Store.Snapshot returns what is stored;
//     Store.Run the run's metadata; Store.LastEvent waits for the close and returns the last
//     event, reading what is stored from then on and one batch, not the log.
//   - Store.RequestAbort asks every store sharing the stream to abort a principal's run;
//     Store.OnAbort delivers those requests (core NATS, at most once).
//   - Threads: Store.ThreadKey names a (principal, threadId) on the wire by a hash;
//     Store.Announce publishes that a run of a thread was accepted and Store.SubscribeThread
//     receives those announcements (<ThreadPrefix>.<key>); Store.QueryThread asks every store
//     which runs of a thread run now (<ThreadPrefix>.query), which Store.OnThreadQuery
//     answers. Core NATS, at most once: a follower subscribes first, then queries.
//   - Store.OnRunClosed hands another service of the process (package threadstore) every run
//     closed for a producer that is gone; Store.DeleteRun removes a run's log and metadata;
//     Store.Conn, Store.JetStream, Store.Provision and Store.Elected let such a service keep
//     its data beside the run logs, on the same connection, with the same retries.
//
// # Layout on JetStream
//
// Config.Streams streams hold the runs (default one): a new run goes to the stream its key
// hashes to, and its metadata records the stream for its life (a resubmit keeps it), so
// changing Streams loses no run; a store opens a stream it does not configure when it first
// reads one of its runs. On a cluster, Open asks the streams' leaders to move until no node
// leads two while a replica's node leads none. Stream 0 is Config.Stream with subjects
// <prefix>.<key>; stream i is Config.Stream_i with <prefix>-i.<key>; key is a base32 SHA-256 of the
// length-delimited principal and runId, so any runId maps to a valid subject and two
// principals never share one. A message holds a batch of events (each a uvarint length and
// its bytes) and the header Wsg-Gen (the generation). Control records carry the header
// Wsg-Ctl: "open" starts a generation on an empty subject (after purging an earlier
// generation's events, or strays that outlived their metadata), "close" ends the log and names,
// in Wsg-After, the sequence of the log's message before it (its terminal's batch). Run
// metadata (RunInfo) and leases live in KV buckets keyed by a hash of the runId alone: a
// runId belongs to at most one principal.
//
// # Invariants
//
//   - Group commit: a writer has one publish in flight, carrying every event appended
//     meanwhile (up to MaxBatchBytes). Each publish expects the previous one's sequence as
//     the subject's last, so a writer whose log the reaper closed or a resubmit restarted
//     is refused (ErrFenced). Retries (for up to DedupWindow) reuse its Nats-Msg-Id, so a
//     retry is never stored twice; one refused for a wrong last sequence compares the
//     subject's last message id with its own to learn that its first attempt was stored.
//   - Stored callbacks run exactly once per event, in append order; after a failure every
//     later append fails.
//   - What waits to be stored is bounded: Append never blocks, and WaitRoom, which a
//     producer calls before each Append, waits while the writer's backlog is at
//     Config.MaxRunBacklog, or the store's at Config.MaxBacklog while the writer's own is not
//     empty: a writer never waits on another's backlog alone.
//   - Offsets are "<gen>-<seq>-<idx>-<tag>" in fixed-width lower-case hex: generation, the
//     batch's stream sequence, the event's index in it, and a tag hashed from the stream's
//     epoch and the run's key. Within a generation they compare as strings in log order. A
//     malformed, foreign, stale or past-the-end offset is refused (ErrInvalidOffset).
//   - Create writes nothing on another principal's run: it creates a lease or metadata only
//     where none exists, and takes an existing run's only after reading that it is the
//     caller's. It writes the lease before the metadata, so that an open run always has a
//     lease for the reapers to find, whenever its store dies. A lease without metadata (a
//     create whose store died between the two) holds the run until that store's liveness
//     lapses or a reaper drops it; a Create of the run waits for that, at most two LeaseTTLs.
//   - Liveness costs one write per store and period, whatever its number of runs: a run's
//     lease, written once by Create, names its store's liveness key ("live.<hash of the
//     owner>" in the lease bucket), a timestamp the store renews every LeaseTTL/5 on a NATS
//     connection of its own, which appends cannot hold up (not a KV TTL, which would not
//     survive a leader change); the lease expires with that key.
//     Every reaper watches the lease bucket and every ReapInterval, for leases whose key
//     expired, first declares the key's store dead by a compare-and-set on the key at the
//     revision it saw expire (a renewal its watcher has not shown yet wins), then claims
//     each lease by compare-and-set (one reaper wins), a bounded number concurrently, and
//     appends RUN_ERROR code producer_lost and the close record, fenced like any append; a
//     log that already ends with a terminal gets the close record alone, so no log ends
//     twice. A store learns from the same watcher that a reaper or a resubmit took one of
//     its writers' leases (Lost fires). A writer that stops without closing its log marks
//     its lease expired (retried until JetStream answers). A resubmit takes the lease
//     before it touches the metadata or the log; a reaper whose claim was overtaken backs
//     off. Expiry is judged by the reaper's clock.
//   - Takeover (takeover.go): a run created WithInput keeps its input in its open record
//     (RunInfo.Replay). When such a run's lease expires and the store has a takeover handler
//     (OnTakeover), its reaper, having claimed the lease, takes the run instead of closing
//     it, at most Config.MaxTakeovers times: it reads the stored events, moves the lease to
//     its own liveness key, names itself in the metadata (Takeovers+1), and publishes the
//     control record "takeover" after the subject's last message, which fences the old
//     producer out (its next publish expects that message's sequence) and tells a reader
//     starting at the tail the offset of the last event. The handler gets the input, the
//     stored events and a Writer that appends after them; the writer finishes the run's
//     thread after its close, as the reaper would have.
//   - An outage spares live producers: a reaper claims expired leases only once JetStream
//     has answered its store for a whole LeaseTTL, time for every live store to renew.
//   - The Readers of one store that follow the live end of one log share one ephemeral
//     consumer (in memory, one replica), a tail's, fanned out in the process (tail.go): a
//     reader whose next message the tail holds (it keeps the last 256) attaches to it; one
//     further behind reads with a consumer of its own and attaches once caught up; one
//     that falls 4,096 messages behind is detached and goes on with its own from where it
//     was. A consumer is deleted when its last reader is closed or reaches the close; it is
//     replaced from the sequence after the last it delivered when its heartbeats stop, the
//     server deletes it, it skips a message, or it stays silent for 5 s while the log holds
//     more. At most 32 consumer creations of a store are in flight.
//   - Readers that start behind their log's end (resumes, joins from the start, snapshots)
//     while 8 or more of the store's readers are, 8 or more within 20 ms on one stream and at
//     most 2^18 messages behind, read the stored part in one pass: an unfiltered consumer
//     from the first message any of them needs, demultiplexed in the process (catchup.go),
//     then go on with the tail or their own consumer; a reader alone reads with its own at
//     once. A consumer filtered to one run walks the other runs' messages between two of its
//     own under the stream store's lock: a thousand at once (every client of a dead gateway
//     resuming) starved the stream's writes, the reaper's producer_lost included.
//   - The reaper hands every run it closes to the OnRunClosed handler (which finishes its
//     thread, since the run's producer, which would have, is gone) once its pass has closed
//     the logs of all the runs it found expired, so that each gets its terminal first.
//   - Retention is the stream's MaxAge and the buckets' TTL; a read of an aged-out or unknown
//     run fails at once with ErrUnknownRun.
package jetstream
