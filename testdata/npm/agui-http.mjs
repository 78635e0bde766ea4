// agui-http.mjs drives @ag-ui/client 1.0.0's HttpAgent, unchanged, for the Go tests in
// e2e/agui_http_test.go: against a gateway's AG-UI transport (POST /agui), or against a
// reference server that streams given events with @ag-ui/encoder 1.0.0's EventEncoder.
//
//   node agui-http.mjs <scenario> <options-json>
//
// Scenarios:
//   run        new HttpAgent({url, threadId, initialMessages: [{id: "user-1", role: "user",
//              content: text}], headers, fetch}).runAgent({runId, forwardedProps}).
//   reference  the same run against a loopback server of this script that answers the POST
//              with options.events, each written by EventEncoder.encode.
//
// Options: url, threadId (default "thread-1"), runId, text, forwardedProps, headers, and for
// "run":
//   progressAfter  once that many TEXT_MESSAGE_CONTENT events came over the wire, print
//                  {"progress":"content"} (the Go test then cuts the connection, or joins the
//                  run over the socket)
//   resume         when the response breaks (a cut connection), repeat the POST with
//                  Last-Event-ID: <the last id received, or -1> and go on with the new
//                  response: what a front end adds to HttpAgent through its fetch option
//   join           send GET <url>?runId=&offset=-1 instead of the POST: the agent joins a run
//                  that another client started
//   abortAfter     once that many TEXT_MESSAGE_CONTENT events came, send DELETE <url>?runId=
//
// The fetch given to HttpAgent records the wire: every server-sent event's id and data, in
// order, as the response carried it. It hands HttpAgent complete events only, and the same
// bytes.
//
// Output: NDJSON on stdout; {"progress":…} lines, then {"result":{events (what the
// subscriber's onEvent saw, after the client's chunk expansion and verification), wire
// ([{id, event}]), newMessages, result (RUN_FINISHED's), runErrors (onRunErrorEvent's events),
// failed (the message runAgent rejected with, or null), requests ([{method, url,
// lastEventId}]), deleteStatus, comments (server-sent events without data: heartbeats)}}. Every scenario is bounded by options.timeoutMs.

import http from "node:http";
import { HttpAgent } from "@ag-ui/client";
import { EventEncoder } from "@ag-ui/encoder";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";

const [scenario, rawOptions] = process.argv.slice(2);
const options = rawOptions ? JSON.parse(rawOptions) : {};
const deadline = setTimeout(() => fail(`timed out after ${options.timeoutMs ?? 30000} ms`), options.timeoutMs ?? 30000);

function fail(message) {
  process.stderr.write(`agui-http: ${message}\n`);
  process.exit(1);
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

const wire = [];
const requests = [];
let contents = 0;
let deleteStatus = null;
let comments = 0;

// onWireEvent counts the replies' deltas and acts on the thresholds of the options.
function onWireEvent(id, event) {
  wire.push({ id, event });
  if (event?.type !== "TEXT_MESSAGE_CONTENT") return;
  contents++;
  if (contents === options.progressAfter) emit({ progress: "content" });
  if (contents === options.abortAfter) {
    const u = `${options.url}?runId=${encodeURIComponent(options.runId)}`;
    requests.push({ method: "DELETE", url: u, lastEventId: null });
    fetch(u, { method: "DELETE", headers: options.headers ?? {} }).then((r) => { deleteStatus = r.status; }, (e) => fail(`DELETE: ${e.message}`));
  }
}

// parseBlock returns the id and the data of one server-sent event (lines without "\n\n").
function parseBlock(block) {
  let id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("id:")) id = line.slice(3).replace(/^ /, "");
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return { id, data: data.length > 0 ? data.join("\n") : null };
}

// wireFetch is the fetch HttpAgent is given: it records the wire and, with options.resume,
// carries the stream over a cut by repeating the request with Last-Event-ID.
async function wireFetch(url, init) {
  let lastId = null;
  const open = (lastEventId) => {
    const headers = { ...init.headers };
    let req = { ...init, headers };
    let u = url;
    if (options.join) {
      u = `${url}?runId=${encodeURIComponent(options.runId)}&offset=-1`;
      req = { method: "GET", headers: { ...options.headers }, signal: init.signal };
    }
    if (lastEventId !== null) req.headers["Last-Event-ID"] = lastEventId;
    requests.push({ method: req.method, url: u, lastEventId });
    return fetch(u, req);
  };
  let res = await open(null);
  if (!res.ok || !res.body) return res;
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let reader = res.body.getReader();
  let buf = "";
  const body = new ReadableStream({
    async pull(controller) {
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (err) {
          if (!options.resume || init.signal?.aborted) throw err;
          // A cut: what came of a partial event is dropped, the log has it.
          buf = "";
          res = await open(lastId ?? "-1");
          if (!res.ok || !res.body) throw new Error(`resume answered ${res.status}: ${await res.text()}`);
          reader = res.body.getReader();
          continue;
        }
        if (chunk.done) {
          controller.close();
          return;
        }
        buf += decoder.decode(chunk.value, { stream: true });
        const blocks = buf.split("\n\n");
        buf = blocks.pop();
        if (blocks.length === 0) continue;
        for (const block of blocks) {
          const { id, data } = parseBlock(block);
          if (data === null) {
            comments++; // a heartbeat, which HttpAgent's parser skips too
            continue;
          }
          if (id !== null) lastId = id;
          onWireEvent(id, JSON.parse(data));
        }
        controller.enqueue(encoder.encode(blocks.join("\n\n") + "\n\n"));
        return;
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: res.status, headers: res.headers });
}

// runHttpAgent runs one turn with a stock HttpAgent and reports what its user sees.
async function runHttpAgent(url, fetchImpl) {
  const agent = new HttpAgent({
    url,
    threadId: options.threadId ?? "thread-1",
    initialMessages: [{ id: "user-1", role: "user", content: options.text ?? "" }],
    headers: options.headers ?? {},
    fetch: fetchImpl,
  });
  const events = [];
  const runErrors = [];
  let failed = null;
  let outcome = { newMessages: [], result: undefined };
  try {
    outcome = await agent.runAgent(
      { runId: options.runId, forwardedProps: options.forwardedProps ?? {} },
      {
        onEvent: ({ event }) => { events.push(event); },
        onRunErrorEvent: ({ event }) => { runErrors.push(event); },
      },
    );
  } catch (err) {
    failed = err instanceof Error ? err.message : String(err);
  }
  return { events, runErrors, failed, newMessages: outcome.newMessages ?? [], result: outcome.result ?? null };
}

async function reference() {
  const events = options.events ?? [];
  const server = http.createServer(async (req, res) => {
    for await (const _ of req); // the RunAgentInput is not needed: the events are given
    const enc = new EventEncoder({ accept: req.headers.accept });
    res.writeHead(200, { "content-type": enc.getContentType(), "cache-control": "no-cache" });
    for (const ev of events) res.write(enc.encode(ev));
    res.end();
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    return await runHttpAgent(`http://127.0.0.1:${server.address().port}/agent`, (u, i) => fetch(u, i));
  } finally {
    server.close();
  }
}

let out;
switch (scenario) {
  case "run":
    out = await runHttpAgent(options.url, wireFetch);
    break;
  case "reference":
    out = await reference();
    break;
  default:
    fail("usage: node agui-http.mjs run|reference <options-json>");
}
// A DELETE still on its way is awaited, within the deadline.
while (options.abortAfter && deleteStatus === null && contents >= options.abortAfter) {
  await new Promise((r) => setTimeout(r, 10));
}
clearTimeout(deadline);
emit({ result: { ...out, wire, requests, deleteStatus, comments } });
process.exit(0);
