// Drives @tanstack/ai-client's ChatClient with `persistence: true` against running gateways, for
// the Go tests in e2e/ (e2e/threads_test.go): a client that never reloads sends the turns, then a
// fresh client (a reload, another tab or device) hydrates the same thread, and the two must show
// the same messages.
//
//   node tanstack-threads.mjs <scenario> <adapter> <options-json>
//
// Adapters: fetch-sse, xhr-sse, fetch-ndjson, xhr-ndjson (as tanstack-http.mjs), and ws: the
// webSocket() adapter with a spread `hydrate` of fetchServerSentEvents.
//
// Output: one NDJSON line {"result":...}. Any failure prints a message on stderr and exits 1.
// Every scenario is bounded by options.timeoutMs.
//
// Options: base (the gateway the turns go to), hydrateBase (the one the reloaded client talks to;
// default base), threadId, turns ([{text, forwardedProps}]), pageSize (history.pageSize of the
// reloaded client), headers (sent by every adapter, e.g. X-Principal-like test headers).
//
// Scenarios:
//   reload  the turns through client A; then client B hydrates: {live, hydrated}, each a list of
//           messages without createdAt (client A's are Dates, the server's ISO strings)
//   older   as reload, then B calls loadOlderMessages() until it has no older page:
//           {live, hydrated, pages} (pages: how many older pages it loaded)
import xhrPackage from 'xmlhttprequest'
import {
  ChatClient,
  fetchHttpStream,
  fetchServerSentEvents,
  webSocket,
  xhrHttpStream,
  xhrServerSentEvents,
} from '@tanstack/ai-client'
import WebSocket from 'ws'

const [scenario, adapterName, rawOptions] = process.argv.slice(2)
if (!scenario || !adapterName || !rawOptions) {
  fail('usage: node tanstack-threads.mjs <scenario> <adapter> <options-json>')
}
const options = JSON.parse(rawOptions)
const deadline = setTimeout(() => fail(`timed out after ${options.timeoutMs ?? 60000} ms`), options.timeoutMs ?? 60000)

function fail(message) {
  process.stderr.write(`tanstack-threads: ${message}\n`)
  process.exit(1)
}

function finish(result) {
  clearTimeout(deadline)
  process.stdout.write(JSON.stringify({ result }) + '\n')
  process.exit(0)
}

function streamingXhr() {
  const xhr = new xhrPackage.XMLHttpRequest()
  xhr.onreadystatechange = () => {
    if (xhr.readyState === 3 && typeof xhr.onprogress === 'function') xhr.onprogress()
  }
  return xhr
}

const headers = options.headers ?? {}
const adapters = {
  'fetch-sse': (base) => fetchServerSentEvents(`${base}/api/chat`, { headers }),
  'xhr-sse': (base) => xhrServerSentEvents(`${base}/api/chat`, { headers, xhrFactory: streamingXhr }),
  'fetch-ndjson': (base) => fetchHttpStream(`${base}/api/chat/ndjson`, { headers }),
  'xhr-ndjson': (base) => xhrHttpStream(`${base}/api/chat/ndjson`, { headers, xhrFactory: streamingXhr }),
  ws: (base) => ({
    ...webSocket(`${base.replace(/^http/, 'ws')}/ws`, { WebSocketImpl: WebSocket }),
    hydrate: fetchServerSentEvents(`${base}/api/chat`, { headers }).hydrate,
  }),
}
const adapter = adapters[adapterName]
if (!adapter) fail(`unknown adapter ${adapterName}; want one of ${Object.keys(adapters).join(', ')}`)

// plain returns messages as JSON values without createdAt.
function plain(messages) {
  return JSON.parse(JSON.stringify(messages)).map(({ createdAt, ...m }) => m)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// settle waits until client's messages stop changing for a while and it is not loading.
async function settle(client, quietMs = 300) {
  let last = ''
  let since = Date.now()
  for (;;) {
    await sleep(25)
    const now = JSON.stringify(client.getMessages())
    if (now !== last || client.getIsLoading()) {
      last = now
      since = Date.now()
    } else if (Date.now() - since >= quietMs) {
      return
    }
  }
}

async function live() {
  const client = new ChatClient({
    connection: adapter(options.base),
    threadId: options.threadId,
    persistence: true,
  })
  client.attach()
  await settle(client) // its own (empty) hydrate
  for (const turn of options.turns) {
    client.updateOptions?.({ forwardedProps: turn.forwardedProps ?? {} })
    await client.sendMessage(turn.text)
  }
  const messages = plain(client.getMessages())
  client.dispose?.()
  return messages
}

// reloaded returns a fresh client of the thread, attached (as a UI wrapper's mount does).
function reloaded() {
  const history = options.pageSize ? { pageSize: options.pageSize } : undefined
  const client = new ChatClient({
    connection: adapter(options.hydrateBase ?? options.base),
    threadId: options.threadId,
    persistence: true,
    history,
  })
  client.attach()
  return client
}

const scenarios = {
  async reload() {
    const liveMessages = await live()
    const client = reloaded()
    await settle(client)
    finish({ live: liveMessages, hydrated: plain(client.getMessages()) })
  },

  async older() {
    const liveMessages = await live()
    const client = reloaded()
    await settle(client)
    let pages = 0
    while (client.getHasOlderMessages()) {
      await client.loadOlderMessages()
      pages++
    }
    finish({ live: liveMessages, hydrated: plain(client.getMessages()), pages })
  },
}

const run = scenarios[scenario]
if (!run) fail(`unknown scenario ${scenario}`)
run().catch((error) => fail(error?.stack ?? String(error)))
