// agui-server.mjs is a small AG-UI server over the standard HTTP transport, the upstream the
// gateway's `--agent agui` is tested against (e2e/agent_agui_test.go). Its encoding is not
// ours: every event is written with @ag-ui/encoder 1.0.0's EventEncoder, and the events a
// client should see are expanded with @ag-ui/client 1.0.0's transformChunks and checked with
// its verifyEvents.
//
//   node agui-server.mjs [--port 8000] [--lifetime SECONDS] [--exit-with-stdin]
//
// POST /agent with a RunAgentInput answers one turn as server-sent events: RUN_STARTED, a
// state snapshot, a reasoning span, a get_weather tool call with its arguments in deltas and
// its result, a state delta, the reply as TEXT_MESSAGE_CHUNKs, a TOOL_CALL_CHUNK call, a
// CUSTOM event, RUN_FINISHED. forwardedProps.intervalMs (default 5) is the pause between
// events, so they reach the gateway over many reads. The request's headers named
// forwardedProps.echoHeaders (an array) are reported in the CUSTOM event's value.
//
// Stdout, one JSON object a line: {"listening":"http://127.0.0.1:<port>/agent"} once ready;
// then for every turn, once its stream is written, {"turn":{"runId", "sent":[events as
// encoded], "expanded":[events as @ag-ui/client expands them]}}. With --exit-with-stdin the
// server stops when its stdin closes (the test that started it went away); with --lifetime it
// stops after that many seconds.

import http from "node:http";
import { from, lastValueFrom, toArray } from "rxjs";
import { EventEncoder } from "@ag-ui/encoder";
import { transformChunks, verifyEvents } from "@ag-ui/client";

process.env.SUPPRESS_TRANSFORMATION_WARNINGS = "true";

function arg(name, def) {
  const i = process.argv.indexOf("--" + name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def;
}
const port = Number(arg("port", "0"));
const lifetime = Number(arg("lifetime", "0"));

// turnEvents returns the events of one turn for the run input.
function turnEvents(input, headers) {
  const { threadId, runId } = input;
  const id = (s) => `${runId}.${s}`;
  const last = [...(input.messages ?? [])].reverse().find((m) => m.role === "user");
  const text = typeof last?.content === "string" ? last.content : "";
  const echo = {};
  for (const h of input.forwardedProps?.echoHeaders ?? []) {
    echo[h] = headers[h.toLowerCase()] ?? null;
  }
  return [
    { type: "RUN_STARTED", threadId, runId },
    { type: "STATE_SNAPSHOT", snapshot: { step: "thinking", cities: [] } },
    { type: "REASONING_START", messageId: id("reasoning") },
    { type: "REASONING_MESSAGE_START", messageId: id("thought"), role: "reasoning" },
    { type: "REASONING_MESSAGE_CONTENT", messageId: id("thought"), delta: "The user asks about " },
    { type: "REASONING_MESSAGE_CONTENT", messageId: id("thought"), delta: "the weather." },
    { type: "REASONING_MESSAGE_END", messageId: id("thought") },
    { type: "REASONING_END", messageId: id("reasoning") },
    { type: "TOOL_CALL_START", toolCallId: id("call"), toolCallName: "get_weather" },
    { type: "TOOL_CALL_ARGS", toolCallId: id("call"), delta: '{"city":' },
    { type: "TOOL_CALL_ARGS", toolCallId: id("call"), delta: '"Zürich",' },
    { type: "TOOL_CALL_ARGS", toolCallId: id("call"), delta: '"unit":"celsius"}' },
    { type: "TOOL_CALL_END", toolCallId: id("call") },
    { type: "TOOL_CALL_RESULT", messageId: id("result"), toolCallId: id("call"), content: "18 °C, clear", role: "tool" },
    { type: "STATE_DELTA", delta: [{ op: "replace", path: "/step", value: "answering" }, { op: "add", path: "/cities/-", value: "Zürich" }] },
    { type: "TEXT_MESSAGE_CHUNK", messageId: id("msg"), role: "assistant", delta: "You said: " },
    { type: "TEXT_MESSAGE_CHUNK", messageId: id("msg"), delta: text },
    { type: "TEXT_MESSAGE_CHUNK", messageId: id("msg"), delta: " — it is 18 °C in Zürich 🌤\nline two" },
    { type: "TOOL_CALL_CHUNK", toolCallId: id("call2"), toolCallName: "remember", parentMessageId: id("msg"), delta: '{"note":' },
    { type: "TOOL_CALL_CHUNK", toolCallId: id("call2"), delta: '"sunny"}' },
    { type: "CUSTOM", name: "headers", value: echo },
    { type: "RUN_FINISHED", threadId, runId, result: { ok: true } },
  ];
}

// expand returns the events as @ag-ui/client expands and verifies them.
async function expand(events) {
  return lastValueFrom(from(events).pipe(transformChunks(false), verifyEvents(false), toArray()));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const server = http.createServer(async (req, res) => {
  if (req.method !== "POST" || req.url !== "/agent") {
    res.writeHead(404).end("not found");
    return;
  }
  let body = "";
  for await (const chunk of req) body += chunk;
  let input;
  try {
    input = JSON.parse(body);
  } catch (e) {
    res.writeHead(400, { "content-type": "text/plain" }).end("body is not JSON: " + e.message);
    return;
  }
  const encoder = new EventEncoder({ accept: req.headers.accept });
  const interval = Number(input.forwardedProps?.intervalMs ?? 5);
  const events = turnEvents(input, req.headers);
  let gone = false;
  res.on("close", () => { gone = true; });
  res.writeHead(200, { "content-type": encoder.getContentType(), "cache-control": "no-cache" });
  for (const ev of events) {
    if (gone) return;
    res.write(encoder.encode(ev));
    if (interval > 0) await sleep(interval);
  }
  res.end();
  const expanded = await expand(events);
  process.stdout.write(JSON.stringify({ turn: { runId: input.runId, sent: events, expanded } }) + "\n");
});

server.listen(port, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ listening: `http://127.0.0.1:${server.address().port}/agent` }) + "\n");
});

const stop = () => {
  server.close();
  server.closeAllConnections?.();
  process.exit(0);
};
if (process.argv.includes("--exit-with-stdin")) {
  process.stdin.on("end", stop);
  process.stdin.on("close", stop);
  process.stdin.resume();
}
if (lifetime > 0) setTimeout(stop, lifetime * 1000).unref();
