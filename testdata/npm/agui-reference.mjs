// agui-reference.mjs is the reference side of the differential conformance test
// (protocol/conformance_test.go). It decides event sequences with the published
// @ag-ui/core and @ag-ui/client 1.0.0, the way AGUI.md section 5 obtains its
// outcomes:
//
//   1. "upgrade" cases only: the client's CompatibilityBoundary (exported by
//      @ag-ui/client), driven through its own run(input, next) entry with a next
//      agent that emits the case's events, exactly as runAgent places it innermost
//      next to run();
//   2. EventSchemas.safeParse from @ag-ui/core/schemas (the main entry of
//      @ag-ui/core carries no validators); the first failing event is reported
//      with its index and its first zod issue;
//   3. the parsed (loose) outputs through transformChunks(false) then
//      verifyEvents(false), with SUPPRESS_TRANSFORMATION_WARNINGS=true.
//
// The upgrade maps events one by one (its only state is the THINKING_* ids), so
// it runs over the whole list first. Then the events are fed one at a time
// through a Subject, so each is parsed, expanded and verified before the next
// one is looked at, as in a live run: a schema failure after a verification
// failure is never reached.
//
// Input: NDJSON on stdin, one case a line: {"id":..., "events":[...], "upgrade":bool}.
// Two optional flags serve the vectors of AGUI.md: "schemaOnly" (each event is
// only parsed, as the schema vectors S* are judged) and "skipSchema" (the parse
// is skipped, as for the rows marked † that an in-process producer emits).
// Output: one line a case, in input order:
//   {"id", "ok":true, "events":[expanded events]}
//   {"id", "ok":false, "error":message, "emitted":[events emitted before the failure],
//    "schema":{"index", "path", "message", "issues"}}   ("schema" only for schema rejections)
//   {"id", "ok":false, "error":message, "emitted":[...], "crash":{"index", "message"}}
//    when the upgrade itself threw on event index (a TypeError on a null where it
//    expects an object: the client's transports never hand it such an event)
// A line that is not a case object yields {"id":null, "ok":false, "fatal":message}.
//
// Minted UUIDs (legacy THINKING_* upgrade) are left as they are: the Go test
// normalises both sides with one function.

import { createInterface } from "node:readline";
import { Subject, of } from "rxjs";
import { EventSchemas } from "@ag-ui/core/schemas";
import { CompatibilityBoundary, transformChunks, verifyEvents } from "@ag-ui/client";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";

// upgradeEvents runs the events through a fresh CompatibilityBoundary's run(),
// whose next agent emits them; the boundary is synchronous (a map), so the
// result is complete when subscribe returns.
function upgradeEvents(events) {
  const boundary = new CompatibilityBoundary();
  const input = { threadId: "t1", runId: "r1", messages: [], tools: [], context: [] };
  const next = { run: () => of(...events) };
  const out = [];
  let failure;
  boundary.run(input, next).subscribe({
    next: (e) => out.push(e),
    error: (err) => {
      failure = err;
    },
  });
  return { out, failure };
}

function message(err) {
  return err instanceof Error ? err.message : String(err);
}

// parse appends the parsed form of event i to out, or returns the case's
// rejection with the first zod issue (and all of them, for diagnosis).
function parse(event, i, id, out) {
  const parsed = EventSchemas.safeParse(event);
  if (parsed.success) {
    out.push(parsed.data);
    return undefined;
  }
  const issues = parsed.error.issues.map((is) => ({
    path: is.path.map(String).join("."),
    message: is.message,
  }));
  return {
    id,
    ok: false,
    error: `schema: event ${i}: ${issues[0].path}: ${issues[0].message}`,
    schema: { index: i, path: issues[0].path, message: issues[0].message, issues },
  };
}

function decide(c) {
  const events = Array.isArray(c.events) ? c.events : [];
  let input = events;
  if (c.upgrade) {
    // If the boundary throws on event i, events 0..i-1 were delivered: they are
    // decided first, and the boundary's failure stands only if they pass.
    const { out, failure } = upgradeEvents(events);
    input = out;
    input.failure = failure;
    input.failureIndex = out.length;
  }

  if (c.schemaOnly) {
    const parsed = [];
    for (let i = 0; i < input.length; i++) {
      const rejected = parse(input[i], i, c.id, parsed);
      if (rejected) return rejected;
    }
    return { id: c.id, ok: true, events: parsed };
  }

  const emitted = [];
  let error;
  const source = new Subject();
  source.pipe(transformChunks(false), verifyEvents(false)).subscribe({
    next: (e) => emitted.push(e),
    error: (err) => {
      error = err;
    },
  });

  for (let i = 0; i < input.length && error === undefined; i++) {
    const parsed = [];
    if (c.skipSchema) {
      parsed.push(input[i]);
    } else {
      const rejected = parse(input[i], i, c.id, parsed);
      if (rejected) return { ...rejected, emitted };
    }
    try {
      source.next(parsed[0]);
    } catch (err) {
      // An operator that throws synchronously outside rxjs's error channel.
      error = err;
    }
  }
  if (error === undefined && input.failure !== undefined) {
    const m = message(input.failure);
    return { id: c.id, ok: false, error: m, emitted, crash: { index: input.failureIndex, message: m } };
  }
  if (error !== undefined) {
    return { id: c.id, ok: false, error: message(error), emitted };
  }
  source.complete();
  return { id: c.id, ok: true, events: emitted };
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
const out = [];
let scheduled = false;
function flush() {
  scheduled = false;
  if (out.length > 0) {
    process.stdout.write(out.join(""));
    out.length = 0;
  }
}
rl.on("line", (line) => {
  if (line.trim() === "") return;
  let result;
  try {
    const c = JSON.parse(line);
    result = decide(c);
  } catch (err) {
    result = { id: null, ok: false, fatal: message(err) };
  }
  out.push(JSON.stringify(result) + "\n");
  // Flush at once when the writer waits for each answer (shrinking), and in
  // batches otherwise; readline delivers a whole chunk's lines before yielding.
  if (out.length >= 256) {
    flush();
  } else if (!scheduled) {
    scheduled = true;
    setImmediate(flush);
  }
});
rl.on("close", flush);
