// The reference server for side-by-side runs with wsbench: what a user of @tanstack/ai would
// run instead of the gateway. It serves GET /ws with @tanstack/ai's own toWebSocketStream
// (conversation sockets) and resumeWebSocketStream (?offset= resume sockets), both over its
// in-process memoryStream durability, on the ws package, and answers every run frame with the
// same scripted turn as the gateway's demo agent (agent/demo): RUN_STARTED, TEXT_MESSAGE_START,
// forwardedProps.demo.tokens deltas "t1 " … "tN ", TEXT_MESSAGE_END, RUN_FINISHED, with
// forwardedProps.demo.intervalMs between two events (default 20; 0 = as fast as possible).
// With forwardedProps.demo.timestamps true every chunk carries "timestamp", the wall-clock time
// it is yielded at in whole milliseconds since the epoch, rounded down (AG-UI 1.0 requires an
// integer), and "metadata":{"emitMicros"}, the same in microseconds, as the demo agent's
// events do.
//
//   node bench/reference-server.mjs [--addr 127.0.0.1:8090]
//
// It prints one line {"msg":"listening","addr":"host:port","pid":N} on stdout when ready,
// answers GET /healthz, and exits on SIGTERM or SIGINT.
import http from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { WebSocketServer } from 'ws'
import { memoryStream, resumeWebSocketStream, toWebSocketStream } from '@tanstack/ai'

function flag(name, def) {
  const i = process.argv.indexOf(name)
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def
}

const addr = flag('--addr', '127.0.0.1:8090')
const sep = addr.lastIndexOf(':')
const host = addr.slice(0, sep)
const port = Number(addr.slice(sep + 1))

// The demo agent's script (agent/demo), as an async iterable of AG-UI chunks.
async function* demoTurn(ctx) {
  const opts = (ctx.forwardedProps && ctx.forwardedProps.demo) || {}
  const tokens = Number.isInteger(opts.tokens) ? opts.tokens : 3
  const interval = Number.isInteger(opts.intervalMs) ? opts.intervalMs : 20
  const timestamps = opts.timestamps === true
  const msg = `${ctx.runId}.msg1`
  const events = function* () {
    yield { type: 'RUN_STARTED', threadId: ctx.threadId, runId: ctx.runId }
    yield { type: 'TEXT_MESSAGE_START', messageId: msg, role: 'assistant' }
    for (let i = 1; i <= tokens; i++) yield { type: 'TEXT_MESSAGE_CONTENT', messageId: msg, delta: `t${i} ` }
    yield { type: 'TEXT_MESSAGE_END', messageId: msg }
    yield { type: 'RUN_FINISHED', threadId: ctx.threadId, runId: ctx.runId }
  }
  // Event i is due i intervals after the first, as in agent/demo.
  let i = 0
  let start = 0
  for (const ev of events()) {
    if (ctx.signal.aborted) return
    if (i === 0) start = performance.now()
    const wait = start + i * interval - performance.now()
    if (i > 0 && interval > 0 && wait > 0) await sleep(wait, undefined, { signal: ctx.signal }).catch(() => {})
    i++
    if (timestamps) {
      const us = Math.round((performance.timeOrigin + performance.now()) * 1000)
      ev.timestamp = Math.floor(us / 1000)
      ev.metadata = { emitMicros: us }
    }
    yield ev
  }
}

const server = http.createServer((req, res) => {
  if (req.url === '/healthz' || req.url === '/readyz') {
    res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n')
    return
  }
  res.writeHead(404).end()
})

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 1 << 20 })
server.on('upgrade', (req, socket, head) => {
  const url = new URL(req.url, `http://${req.headers.host || addr}`)
  if (url.pathname !== '/ws') {
    socket.destroy()
    return
  }
  wss.handleUpgrade(req, socket, head, (ws) => {
    const request = new Request(url)
    if (url.searchParams.has('offset')) {
      resumeWebSocketStream(ws, { adapter: memoryStream(request) })
      return
    }
    toWebSocketStream(ws, request, {
      onRun: demoTurn,
      durability: (ctx) => memoryStream(ctx.request),
    })
  })
})

server.listen(port, host, () => {
  const a = server.address()
  process.stdout.write(JSON.stringify({ msg: 'listening', addr: `${a.address}:${a.port}`, pid: process.pid }) + '\n')
})

function shutdown() {
  for (const ws of wss.clients) ws.terminate()
  server.close(() => process.exit(0))
  setTimeout(() => process.exit(0), 2000).unref()
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)
