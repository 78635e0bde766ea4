// Package protocol does the AG-UI 1.0 wire work of the gateway: it decodes and
// schema-checks events, upgrades legacy ones, expands chunks, verifies the
// event sequence, and encodes the WebSocket frames. It ports what
// @ag-ui/core and @ag-ui/client 1.0.0 decide (docs/AGUI.md), error texts
// included, and imports nothing else of the project.
//
// # Events
//
// An [Event] is an event's compact JSON encoding plus its top-level members,
// split without decoding the values. [DecodeEvent] checks one event against
// the 1.0 schema: a rejection is a [*SchemaError] with zod's path and
// message. Unknown keys are kept at every depth; an accepted event re-encodes
// to exactly its input bytes (compacted), except that RUN_STARTED.input gets
// its parse defaults. Events are immutable and may be shared. [EndOf] (and
// [Event.End]) is the one reading of how a run ended, given its terminal
// event: finished, interrupted or error, with the RUN_ERROR's code.
//
// # Pipeline
//
// A [Pipeline] carries one turn: [Pipeline.Push] takes one event as JSON and
// returns the events it expands to, each schema-checked, chunk-expanded
// (transformChunks) and verified (verifyEvents). Chunk expansion and
// verification failures are [*ViolationError]s whose text is the client's.
// After the first error a pipeline refuses more input; [Pipeline.Fail] gives
// the events that end the turn with a RUN_ERROR. With
// [PipelineOptions].Upgrade the legacy upgrade of the client's compatibility
// boundary (THINKING_* to REASONING_*, null optionals removed, binary parts)
// runs before the schema check. [VerifyStream] runs a pipeline over NDJSON for
// `wsgateway verify`.
//
// # Frames and run input
//
// [DecodeClientFrame] classifies an inbound text frame as an abort, an auth
// frame (a fresh token for the socket), a follow or unfollow frame (a thread),
// or a run frame whose [RunAgentInput] is validated by [DecodeRunAgentInput] (errors are
// [*InputError]s naming the field). [AppendEnvelope], [AppendRunEnvelope] (a
// followed thread's run), [AppendRunError] and
// [PingFrame] build the outbound frames; [DecodeServerFrame] reads them back,
// and [Fields] reads a few fields of many frames without allocating.
// [RunAccepted] is the gateway's marker event, which is never verified.
//
// Nothing in the package starts goroutines, and only VerifyStream blocks (on
// its reader and writer); a Pipeline is not safe for concurrent use,
// everything else is.
package protocol
