// Package thread builds a conversation's transcript (the UIMessages @tanstack/ai-client shows)
// from runs' inputs and stored events.
//
// A [Transcript] is a thread's settled state; it round-trips through encoding/json. For each
// run, in order of acceptance: [Transcript.Accept] merges the run's input (the RunAgentInput
// the client posted) into it, and once the run's log is closed [Transcript.Finish] applies the
// run's stored events as the client's StreamProcessor (@tanstack/ai 0.58.0, driven as
// @tanstack/ai-client 0.33.2's ChatClient drives it) would. While the run is still going,
// [Transcript.Active] answers a hydrate from the events so far without changing the
// transcript. [Page] cuts a window of messages for paging. Everything here is pure logic: no
// I/O, no clock, no locking (callers own a Transcript).
//
// # Ids and times
//
// What the client names at random (messages created lazily by reasoning or a tool call before
// any TEXT_MESSAGE_START, the empty assistant message of a failed run, a snapshot message
// without id, a STEP_STARTED without stepName) is named here from the run id: "<runId>-a1",
// "<runId>-a2", … for messages, "<runId>-s<n>" for steps, so that every gateway building the
// same run mints the same ids. A message's createdAt comes from metadata.tanstack.createdAt of
// its TEXT_MESSAGE_START (ISO, as agents should send it), else from the timestamp of the event
// that created it, else it is left out.
//
// # Interrupts
//
// A RUN_FINISHED whose outcome is an interrupt sets [Transcript.Interrupts] (verbatim, with the
// paused run's id). Accept of a run whose resume answers one of them clears them and keeps them
// aside; Finish of that run drops them if it ends with RUN_FINISHED, and reports them again if
// it ends with RUN_ERROR.
//
// # Limits
//
// Not ported, because no agent of this project sends them: structured output (CUSTOM
// structured-output.*), CUSTOM ui-resource parts, and the "name" of snapshot messages (a
// Message has no name). Ids with lone UTF-16 surrogates (valid JSON escapes, distinct ids in
// JavaScript) cannot be kept apart: a transcript stored as JSON by Go reads each as U+FFFD.
// TOOL_CALL_END's input, when it becomes a call's arguments, is written as compact JSON,
// which may differ from JSON.stringify's spelling (escapes, number forms).
//
// A reply that starts with reasoning before any TEXT_MESSAGE_START is built right, but the
// client does not rebuild it on a reload mid-run (reasoning is not one of its rebuild
// triggers): agents should send TEXT_MESSAGE_START before the reasoning events (valid AG-UI).
package thread
