// Package threadstore keeps every conversation's thread on NATS JetStream, in a KV bucket
// beside the run logs of a jetstream.Store and on its connection. It is the only package that
// imports package thread (the transcript a run's events make).
//
// # API
//
//   - Open(ctx, runs, Config) creates or updates the bucket (Config.Bucket, TTL
//     Config.Retention) and finishes the thread of every run the run store closes for a
//     producer that is gone (jetstream.Store.OnRunClosed). Store.Ready serves /readyz;
//     Store.Close waits for the background work. Close it before the run store.
//   - Store.AcceptRun records a run accepted in its thread and merges its input into the
//     transcript, from the thread Store.ReadThreadAhead read while the run's log was created;
//     Store.FinishRun applies the run's log and records how it ended. Each is a
//     compare-and-set on the thread's head; a store's updates of one thread go one at a time,
//     each from the value the previous wrote.
//   - Store.Thread reads a thread's head; Store.Hydrate answers a page of its messages (as
//     JSON: the transcript's types stay here) and Store.AgentMessages the messages a run's
//     agent is given, merged with what the run posted, reading only the records they reach
//     (log.go). Store.Threads lists a principal's threads from the heads' headers;
//     Store.DeleteThread removes a thread, its records and its runs' logs and metadata.
//
// # Layout
//
// A thread is a log (docs/THREADS.md, "How a thread is stored"): a head under the key
// "<hash of the principal>.<hash of principal and threadId>" (so that a principal's threads are
// listed by a key filter and no key reveals a principal or a threadId) holds the thread's
// runs, title, times and the messages that may still change, and is written by
// compare-and-set on its revision (retried on a conflict: two gateways lose no update, a
// reader never sees half of one), with what a list shows in a header (head.go). Settled
// messages are sealed into records written once below the thread's key, named by the head and
// by segments of 16 records (log.go). A value or record too large for one message is written
// across parts, keys "<key>.<write's id>.<i>" whose values, concatenated, are its JSON. No
// message is left out. Every key expires with the bucket's TTL; a thread in use writes its
// records again once the oldest is older than half of it.
package threadstore
