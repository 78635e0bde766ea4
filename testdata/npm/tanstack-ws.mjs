// Drives the real @tanstack/ai-client webSocket() adapter (and its ChatClient) against a running
// gateway, for the Go tests in e2e/. Node has no WebSocket in this version, so the `ws` package is
// handed to the adapter as its WebSocket implementation.
//
//   node tanstack-ws.mjs <scenario> <ws-url> [options-json]
//
// Output: NDJSON on stdout. Progress lines {"progress":...} may come first (the Go test reacts to
// them, for example by cutting connections); the last line is {"result":...}. Any failure prints
// a message on stderr and exits 1. Every scenario is bounded by a deadline (options.timeoutMs).
//
// Scenarios (options in parentheses):
//   chat     one turn through ChatClient.sendMessage (text, threadId, forwardedProps)
//   turns    several turns over one conversation socket (turns: [{runId, text, forwardedProps}])
//   resume   one turn; prints {"progress":"cut"} after cutAfter content events and keeps reading
//            while the client reconnects by itself (runId, text, forwardedProps, cutAfter)
//   join     a turn on one client and joinRun from a second client, while it runs
//            (joinAfter content events) and again after it finished (runId, text, forwardedProps)
//   abort    one turn aborted through the adapter's abort signal after abortAfter content
//            events, then joinRun of the run to read its log (runId, text, forwardedProps)
//   raw      a raw socket: sends options.frames as text frames and prints every frame received
//            until options.expect frames arrived
import WebSocket from 'ws'
import { ChatClient, webSocket } from '@tanstack/ai-client'

const [scenario, url, rawOptions] = process.argv.slice(2)
if (!scenario || !url) {
  fail('usage: node tanstack-ws.mjs <scenario> <ws-url> [options-json]')
}
const options = rawOptions ? JSON.parse(rawOptions) : {}
const deadline = setTimeout(
  () => fail(`timed out after ${options.timeoutMs ?? 20000} ms`),
  options.timeoutMs ?? 20000,
)

// opened records the URL of every socket the client opens, so a test can see resumes.
const opened = []
class RecordingWebSocket extends WebSocket {
  constructor(address, protocols) {
    super(address, protocols)
    opened.push(String(address))
  }
}

function fail(message) {
  process.stderr.write(`tanstack-ws: ${message}\n`)
  process.exit(1)
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + '\n')
}

function finish(result) {
  clearTimeout(deadline)
  emit({ result: { ...result, opened } })
  process.exit(0)
}

function userMessages(text) {
  return [{ id: 'user-1', role: 'user', parts: [{ type: 'text', content: text }] }]
}

function runContext(o) {
  return { threadId: o.threadId ?? 'thread-1', runId: o.runId, forwardedProps: o.forwardedProps ?? {} }
}

const isTerminal = (chunk) => chunk.type === 'RUN_FINISHED' || chunk.type === 'RUN_ERROR'

// readTurn pulls chunks from iterator until a terminal event, calling onChunk for each.
async function readTurn(iterator, onChunk) {
  const chunks = []
  for (;;) {
    const { value, done } = await iterator.next()
    if (done) throw new Error(`stream ended after ${chunks.length} chunks without a terminal event`)
    chunks.push(value)
    if (onChunk) onChunk(value, chunks)
    if (isTerminal(value)) return chunks
  }
}

async function readAll(iterable) {
  const chunks = []
  for await (const chunk of iterable) chunks.push(chunk)
  return chunks
}

const contentCount = (chunks) => chunks.filter((c) => c.type === 'TEXT_MESSAGE_CONTENT').length

function adapter() {
  return webSocket(url, { WebSocketImpl: RecordingWebSocket })
}

const scenarios = {
  async chat() {
    const chunks = []
    const client = new ChatClient({
      connection: adapter(),
      threadId: options.threadId ?? 'thread-chat',
      forwardedProps: options.forwardedProps ?? {},
      onChunk: (chunk) => chunks.push(chunk),
    })
    await client.sendMessage(options.text)
    const messages = client.getMessages()
    const error = client.getError?.()
    finish({ messages, chunks, error: error ? String(error.message ?? error) : null })
  },

  async turns() {
    const conn = adapter()
    const iterator = conn.subscribe()[Symbol.asyncIterator]()
    const turns = []
    for (const turn of options.turns) {
      await conn.send(userMessages(turn.text), undefined, undefined, runContext(turn))
      turns.push(await readTurn(iterator))
    }
    finish({ turns })
  },

  async resume() {
    const conn = adapter()
    const iterator = conn.subscribe()[Symbol.asyncIterator]()
    await conn.send(userMessages(options.text), undefined, undefined, runContext(options))
    let announced = false
    const chunks = await readTurn(iterator, (_, seen) => {
      if (!announced && contentCount(seen) >= options.cutAfter) {
        announced = true
        emit({ progress: 'cut', received: seen.length })
      }
    })
    finish({ chunks })
  },

  async join() {
    const conn = adapter()
    const iterator = conn.subscribe()[Symbol.asyncIterator]()
    await conn.send(userMessages(options.text), undefined, undefined, runContext(options))
    let running
    const chunks = await readTurn(iterator, (_, seen) => {
      if (!running && contentCount(seen) >= options.joinAfter) {
        running = readAll(adapter().joinRun(options.runId))
      }
    })
    const joinedRunning = await running
    const joinedFinished = await readAll(adapter().joinRun(options.runId))
    finish({ chunks, joinedRunning, joinedFinished })
  },

  async abort() {
    const conn = adapter()
    const controller = new AbortController()
    const chunks = []
    const iterator = conn.subscribe(controller.signal)[Symbol.asyncIterator]()
    await conn.send(userMessages(options.text), undefined, controller.signal, runContext(options))
    for (;;) {
      const { value, done } = await iterator.next()
      if (done) break
      chunks.push(value)
      if (contentCount(chunks) >= options.abortAfter) controller.abort()
    }
    const log = await readAll(adapter().joinRun(options.runId))
    finish({ chunks, log })
  },

  async raw() {
    const ws = new RecordingWebSocket(url)
    const frames = []
    ws.on('message', (data, isBinary) => {
      if (isBinary) return
      const frame = JSON.parse(String(data))
      if (frame.type === 'ping') return
      frames.push(frame)
      if (frames.length >= options.expect) finish({ frames })
    })
    ws.on('close', (code, reason) => fail(`socket closed ${code} ${reason} after ${frames.length} frames`))
    await new Promise((resolve, reject) => {
      ws.once('open', resolve)
      ws.once('error', reject)
    })
    for (const frame of options.frames) ws.send(typeof frame === 'string' ? frame : JSON.stringify(frame))
  },
}

const run = scenarios[scenario]
if (!run) fail(`unknown scenario ${scenario}`)
run().catch((error) => fail(error?.stack ?? String(error)))
