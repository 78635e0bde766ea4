// Package thread builds a conversation's transcript (the UIMessages @tanstack/ai-client shows)
// from runs' inputs and stored events.
//
// A [Transcript] is a thread's settled state. [Transcript.Accept] merges a newly accepted run's
// input (RunAgentInput) into it; [Transcript.Finish] applies the run's stored events as the
// client's StreamProcessor (@tanstack/ai 0.58.0) would; [Transcript.Active] answers a hydrate
// while a run is still running; [Page] cuts a window of messages for paging. Everything here is
// pure logic: no I/O, no locking (callers own a Transcript).
//
// Messages the client creates lazily (reasoning or a tool call before any TEXT_MESSAGE_START,
// the empty assistant message of a failed run) get random ids on the client; here they get
// ids derived from the run id ("<runId>-a1", "<runId>-a2", …), so every gateway building the
// same run mints the same ids.
package thread
