// Package jetstream keeps every run's event log on NATS JetStream: append with group commit
// and fencing, read and tail from an offset, close, run metadata, producer leases, the
// reaper, retention, and the embedded nats-server used when no external one is configured.
//
// # API
//
//   - Open(ctx, Config) connects (or starts an embedded server under Config.DataDir) and
//     creates or updates the stream and the two KV buckets. Store.Ready serves /readyz;
//     Store.Close releases this process's leases and stops what Open started.
//   - Store.Create(ctx, principal, runID, threadID) starts a run's log (or a new generation of
//     it, on a resubmit by the same principal) and returns its Writer. Writer.Append queues
//     one event and reports its offset through a callback once stored; Writer.WaitRoom waits
//     while too much waits to be stored (Config.MaxRunBacklog, Config.MaxBacklog);
//     Writer.Close writes the close record; Writer.Lost fires when the writer was fenced out
//     or lost its lease.
//   - Store.Read(ctx, principal, runID, after) returns a Reader of the events strictly after
//     an offset (or FromStart, FromNow); Reader.Next blocks while the log is open and returns
//     io.EOF after the close; Reader.After is the offset it reads after, FromNow resolved.
//     Store.Snapshot returns what is stored now. Store.Run returns the run's metadata.
//
// # Layout on JetStream
//
// One stream holds every run; a run's subject is <prefix>.<key>, key a base32 SHA-256 of the
// length-delimited principal and the runId, so any runId maps to a valid subject and two
// principals never share one. A message holds a batch of events (each a uvarint length and
// its bytes) and the header Wsg-Gen (the run's generation). Control records carry no events
// and the header Wsg-Ctl: "open" starts a generation (Create writes it on an empty subject,
// after purging an earlier generation's events or strays that outlived their metadata),
// "close" ends the log. Run metadata (RunInfo) and leases live in KV buckets keyed by a
// hash of the runId alone, since a runId belongs to at most one principal.
//
// # Invariants
//
//   - Group commit: a writer has at most one publish in flight; it carries every event
//     appended while the previous one was in flight (up to MaxBatchBytes). Each publish
//     expects the previous one's sequence as the subject's last sequence, so a writer whose
//     log was closed by the reaper or restarted by a resubmit is refused (ErrFenced). It
//     carries a Nats-Msg-Id, and retries (timeouts, reconnects, leader changes, for up to
//     DedupWindow) reuse it: a retry is never stored twice, and one refused for a wrong last
//     sequence compares the subject's last message id with its own to learn that its first
//     attempt was stored (nats-server checks the expected sequence before its duplicate
//     window).
//   - Stored callbacks run exactly once per event, in append order; after a failure every
//     later append fails.
//   - What waits to be stored is bounded: Append never blocks, but Writer.WaitRoom, which a
//     producer calls before each Append, waits while the writer's backlog (the bytes of
//     events appended and not yet stored, plus a fixed cost per event) is at
//     Config.MaxRunBacklog, or the store's at Config.MaxBacklog while the writer's own is
//     not empty. A writer never waits on another writer's backlog alone.
//   - Offsets are "<gen>-<seq>-<idx>-<tag>" in fixed-width lower-case hex: the run's
//     generation, the batch message's stream sequence, the event's index in the batch, and a
//     tag hashed from the stream's epoch (a random value kept in the stream's metadata) and
//     the run's key. Within a generation they compare as strings in log order. A malformed,
//     foreign, stale or past-the-end offset is refused with ErrInvalidOffset, never resumed
//     elsewhere.
//   - Create writes nothing a run of another principal holds: it creates the lease and the
//     metadata only where none exists (KV create), and takes an existing run's lease and
//     metadata only after reading that the run is the caller's. A refused Create leaves the
//     run's lease, metadata, log and revisions as they were, so the owner's writer keeps
//     renewing and appending.
//   - Leases are renewed timestamps (not KV TTLs), so they survive a cluster leader change;
//     each store renews its writers' leases every LeaseTTL/3. Every store's reaper watches
//     the lease bucket; every ReapInterval it claims expired leases by compare-and-set (so
//     one reaper wins), then appends a RUN_ERROR with code producer_lost and the close
//     record, fenced like any append; a log whose last event is already a terminal
//     (RUN_FINISHED or RUN_ERROR) gets the close record alone, so no log ends twice. A resubmit takes the lease before it touches the
//     metadata or the log, and a reaper whose claim was overtaken backs off. Expiry is judged
//     by the reaper's clock: processes sharing a stream need clocks in step to well under
//     LeaseTTL.
//   - An outage spares live producers: a reaper claims expired leases only once JetStream
//     has answered its store for a whole LeaseTTL (a disconnection or an unanswered request
//     restarts the count), time for every live producer to renew. A lease names its owner
//     and the run's generation, so a renewal refused because an earlier one was stored
//     without its answer (requests made while reconnecting are sent after the reconnection)
//     recognises the lease as still its own.
//   - A Reader holds one consumer of its own (ephemeral, in memory, one replica), deleted
//     when the Reader is closed or reaches the log's close (an inactivity threshold bounds
//     what a crashed process leaves), since nats-server caps a stream's consumers (1000 by
//     default; the embedded server lifts the cap). It replaces the consumer, from the
//     sequence after the last one it read, when the consumer's heartbeats stop, the server
//     deletes it, it skips a message, or it stays silent for 5 s while the log holds more: a
//     consumer created while its stream had no leader can heartbeat and deliver nothing.
//   - Open retries creating the stream and buckets a few times when the cluster does not
//     answer in time (a cluster just started, several gateways starting at once).
//   - Retention is the stream's MaxAge and the buckets' TTL; a read of an aged-out or unknown
//     run fails at once with ErrUnknownRun.
package jetstream
