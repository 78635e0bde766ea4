// Package durable serves the Durable Streams HTTP protocol (PUT create, POST append, GET
// catch-up, long-poll and SSE, HEAD, DELETE) on the NATS JetStream that holds the gateway's
// run logs, so that any gateway sharing the NATS serves every stream.
//
// # API
//
//   - New(ctx, Config) creates or updates the stream and the metadata bucket and returns a
//     Handler; Handler.ServeHTTP serves paths under Config.Prefix (and Config.AltPrefix, the
//     TanStack adapter's one-segment shape). Nothing runs in the background: every goroutine
//     belongs to a request.
//
// # Layout on JetStream
//
// One stream (Config.Stream) holds every durable stream: an incarnation of a stream (a create;
// a delete and re-create makes a new one) has its own subject <Config.Subject>.<id>, id random.
// One POST is one message: its body (JSON mode stores the array's elements compacted, joined
// by commas) and the headers Ds-P, Ds-E, Ds-Q (idempotent producer id, epoch, seq), Ds-S
// (Stream-Seq) and Ds-C (closes the stream). A message without body is a close record.
//
// The metadata bucket (Config.Bucket) maps a hash of the principal and the stream's name to
// the incarnation's metadata: content type, TTL or expiry, closed and by which producer
// tuple, the subject's last sequence, the offset of the last data, the last Stream-Seq, the
// producers' epochs and sequences, the fork source and the forks' reference count.
//
// # Invariants
//
//   - Offsets are "%016d_%016d" of the stream sequence of the last message covered and 0:
//     opaque to clients, strictly increasing and ordered as strings. A stream's first offset
//     is 0000000000000000_0000000000000000. A fork's own messages are stored after the fork
//     was made, so their sequences follow every inherited one.
//   - Appends are serialized per stream across processes: each publish expects the subject's
//     last sequence recorded in the metadata, and the metadata is then updated by
//     compare-and-set. The metadata thus lags the log by at most one message (the publisher
//     died between the two); an appender refused for a wrong last sequence first rolls the
//     metadata forward from the subject's last message, whose headers say what it changed.
//     Producer state and Stream-Seq are validated against the rolled-forward metadata, so a
//     retried append is recognised on any gateway and never stored twice.
//   - Within a process, appends to one stream take turns (a lock per stream), and the next
//     one starts from the metadata the last one wrote (a bounded cache) instead of reading it
//     back. The cache is only a guess: the publish is fenced and the update compare-and-set
//     as always, and an append the cached metadata would not accept (a duplicate, a stale
//     epoch, a gap, a closed stream) is decided again on metadata read from the bucket.
//     Every other read of metadata goes to the bucket's leader.
//   - Readers read messages with batched direct gets; long-poll and SSE wake on the core NATS
//     message of the metadata key's update, which follows the data's acknowledgement.
//   - TTL (sliding, renewed by reads and writes) and Expires-At are checked on every access:
//     an expired stream is deleted then, or soft-deleted while forks reference it. The
//     stream's MaxAge and the bucket's TTL (Config.Retention) bound every stream's life from
//     its last write.
package durable
