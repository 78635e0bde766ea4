// Drives the four real HTTP connection adapters of @tanstack/ai-client against a running gateway,
// for the Go tests in e2e/ (e2e/http_tanstack_test.go):
//
//   fetch-sse     fetchServerSentEvents(<base>/api/chat)
//   xhr-sse       xhrServerSentEvents(<base>/api/chat)
//   fetch-ndjson  fetchHttpStream(<base>/api/chat/ndjson)
//   xhr-ndjson    xhrHttpStream(<base>/api/chat/ndjson)
//
//   node tanstack-http.mjs <scenario> <adapter> <base-url> [options-json]
//
// Node has fetch but no XMLHttpRequest: the xhr adapters get one from the `xmlhttprequest`
// package through their xhrFactory option. That implementation appends to responseText as data
// arrives and reports it with readystatechange (readyState 3) but fires no progress events, so
// the factory forwards each readyState 3 change to onprogress, as a browser's XHR fires it.
//
// Output: NDJSON on stdout. Progress lines {"progress":...} may come first (the Go test reacts to
// them, for example by cutting connections); the last line is {"result":...}. Every result holds
// `requests`: each HTTP request the adapters made ({method, url, lastEventId}). Any failure prints
// a message on stderr and exits 1. Every scenario is bounded by options.timeoutMs.
//
// Scenarios (options in parentheses):
//   chat    one turn through ChatClient.sendMessage (text, threadId, forwardedProps)
//   resume  one turn through the adapter's connect(); prints {"progress":"cut"} after cutAfter
//           content events and keeps reading while the adapter reconnects by itself with
//           Last-Event-ID (runId, text, forwardedProps, cutAfter)
//   join    a turn through connect(), joinRun from a second adapter after joinAfter content
//           events, and joinRun again after the turn finished (runId, text, forwardedProps,
//           joinAfter)
import xhrPackage from 'xmlhttprequest'
import {
  ChatClient,
  fetchHttpStream,
  fetchServerSentEvents,
  xhrHttpStream,
  xhrServerSentEvents,
} from '@tanstack/ai-client'

const [scenario, adapterName, base, rawOptions] = process.argv.slice(2)
if (!scenario || !adapterName || !base) {
  fail('usage: node tanstack-http.mjs <scenario> <adapter> <base-url> [options-json]')
}
const options = rawOptions ? JSON.parse(rawOptions) : {}
const deadline = setTimeout(
  () => fail(`timed out after ${options.timeoutMs ?? 30000} ms`),
  options.timeoutMs ?? 30000,
)

function fail(message) {
  process.stderr.write(`tanstack-http: ${message}\n`)
  process.exit(1)
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + '\n')
}

// requests records every HTTP request of the adapters.
const requests = []

function finish(result) {
  clearTimeout(deadline)
  emit({ result: { ...result, requests } })
  process.exit(0)
}

function headerOf(headers, name) {
  if (!headers) return null
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name.toLowerCase()) return v
  }
  return null
}

function recordingFetch(url, init = {}) {
  requests.push({ method: init.method ?? 'GET', url: String(url), lastEventId: headerOf(init.headers, 'Last-Event-ID') })
  return fetch(url, init)
}

function streamingXhr() {
  const xhr = new xhrPackage.XMLHttpRequest()
  const request = { method: null, url: null, lastEventId: null }
  const open = xhr.open
  xhr.open = function (method, url, ...rest) {
    request.method = method
    request.url = String(url)
    requests.push(request)
    return open.call(this, method, url, ...rest)
  }
  const setRequestHeader = xhr.setRequestHeader
  xhr.setRequestHeader = function (name, value) {
    if (name.toLowerCase() === 'last-event-id') request.lastEventId = value
    return setRequestHeader.call(this, name, value)
  }
  xhr.onreadystatechange = () => {
    if (xhr.readyState === 3 && typeof xhr.onprogress === 'function') xhr.onprogress()
  }
  return xhr
}

const adapters = {
  'fetch-sse': () => fetchServerSentEvents(`${base}/api/chat`, { fetchClient: recordingFetch }),
  'xhr-sse': () => xhrServerSentEvents(`${base}/api/chat`, { xhrFactory: streamingXhr }),
  'fetch-ndjson': () => fetchHttpStream(`${base}/api/chat/ndjson`, { fetchClient: recordingFetch }),
  'xhr-ndjson': () => xhrHttpStream(`${base}/api/chat/ndjson`, { xhrFactory: streamingXhr }),
}
const adapter = adapters[adapterName]
if (!adapter) fail(`unknown adapter ${adapterName}; want one of ${Object.keys(adapters).join(', ')}`)

function userMessages(text) {
  return [{ id: 'user-1', role: 'user', parts: [{ type: 'text', content: text }] }]
}

function runContext(o) {
  return { threadId: o.threadId ?? 'thread-1', runId: o.runId, forwardedProps: o.forwardedProps ?? {} }
}

const contentCount = (chunks) => chunks.filter((c) => c.type === 'TEXT_MESSAGE_CONTENT').length

async function readAll(iterable, onChunk) {
  const chunks = []
  for await (const chunk of iterable) {
    chunks.push(chunk)
    if (onChunk) onChunk(chunk, chunks)
  }
  return chunks
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
    const error = client.getError?.()
    finish({ messages: client.getMessages(), chunks, error: error ? String(error.message ?? error) : null })
  },

  async resume() {
    let announced = false
    const chunks = await readAll(
      adapter().connect(userMessages(options.text), undefined, undefined, runContext(options)),
      (_, seen) => {
        if (!announced && contentCount(seen) >= options.cutAfter) {
          announced = true
          emit({ progress: 'cut', received: seen.length })
        }
      },
    )
    finish({ chunks })
  },

  async join() {
    let running
    const chunks = await readAll(
      adapter().connect(userMessages(options.text), undefined, undefined, runContext(options)),
      (_, seen) => {
        if (!running && contentCount(seen) >= options.joinAfter) {
          running = readAll(adapter().joinRun(options.runId))
        }
      },
    )
    const joinedRunning = await running
    const joinedFinished = await readAll(adapter().joinRun(options.runId))
    finish({ chunks, joinedRunning, joinedFinished })
  },
}

const run = scenarios[scenario]
if (!run) fail(`unknown scenario ${scenario}`)
run().catch((error) => fail(error?.stack ?? String(error)))
