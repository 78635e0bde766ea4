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
// default base), threadId, hydrateThreadId (the reloaded client's; default threadId), turns
// ([{text, forwardedProps}]), pageSize (history.pageSize of the reloaded client), headers (sent
// by the live client's HTTP adapters, e.g. an Authorization header), hydrateHeaders (the
// reloaded client's; default headers).
//
// Scenarios (each described where it is defined; messages are printed without createdAt,
// which client A holds as Dates and the server sends as ISO strings):
//   reload      the turns through client A; then client B hydrates: {live, hydrated}
//   older       as reload, then B calls loadOlderMessages() until it has no older page
//   pageturn    as reload with pageSize, B sends options.next, a full reload follows
//   midturn     B reloads while A's last turn streams
//   approval    A's turn asks for approval; B reloads and answers it; C reloads
//   concurrent  clients on options.bases send turns to one thread at once; B reloads
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

const adapters = {
  'fetch-sse': (base, headers) => fetchServerSentEvents(`${base}/api/chat`, { headers }),
  'xhr-sse': (base, headers) => xhrServerSentEvents(`${base}/api/chat`, { headers, xhrFactory: streamingXhr }),
  'fetch-ndjson': (base, headers) => fetchHttpStream(`${base}/api/chat/ndjson`, { headers }),
  'xhr-ndjson': (base, headers) => xhrHttpStream(`${base}/api/chat/ndjson`, { headers, xhrFactory: streamingXhr }),
  ws: (base, headers) => ({
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

// live sends options.turns through a client that never reloads and returns its messages.
async function live() {
  const client = liveClient(options.base)
  await settle(client) // its own (empty) hydrate
  for (const turn of options.turns) await send(client, turn)
  await settle(client)
  const messages = plain(client.getMessages())
  client.dispose()
  return messages
}

// reloaded returns a fresh client of the thread, attached (as a UI wrapper's mount does).
function reloaded() {
  const history = options.pageSize ? { pageSize: options.pageSize } : undefined
  const client = new ChatClient({
    connection: adapter(options.hydrateBase ?? options.base, options.hydrateHeaders ?? options.headers ?? {}),
    threadId: options.hydrateThreadId ?? options.threadId,
    persistence: true,
    history,
  })
  client.attach()
  return client
}

// liveClient returns an attached client of the thread on base.
function liveClient(base, forwardedProps = {}) {
  const client = new ChatClient({
    connection: adapter(base, options.headers ?? {}),
    threadId: options.threadId,
    persistence: true,
    forwardedProps,
  })
  client.attach()
  return client
}

// send sends one turn through client with the turn's forwardedProps.
async function send(client, turn) {
  client.updateOptions({ forwardedProps: turn.forwardedProps ?? {} })
  await client.sendMessage(turn.text)
}

// approvalId returns the id of the approval the client's messages ask for, if any.
function approvalId(client) {
  for (const m of client.getMessages()) {
    for (const p of m.parts) {
      if (p.type === 'tool-call' && p.state === 'approval-requested' && p.approval) return p.approval.id
    }
  }
  return null
}

const scenarios = {
  async reload() {
    const liveMessages = await live()
    const client = reloaded()
    await settle(client)
    finish({ live: liveMessages, hydrated: plain(client.getMessages()) })
  },

  // a reload with history.pageSize, a turn sent from it, then a full reload:
  // {live, paged (the paged client after its turn), hydrated (the full reload)}
  async pageturn() {
    const liveMessages = await live()
    const paged = reloaded()
    await settle(paged)
    await send(paged, options.next)
    await settle(paged)
    const pagedMessages = plain(paged.getMessages())
    paged.dispose()
    const full = new ChatClient({ connection: adapter(options.base, options.headers ?? {}), threadId: options.threadId, persistence: true })
    full.attach()
    await settle(full)
    finish({ live: liveMessages, paged: pagedMessages, hydrated: plain(full.getMessages()) })
  },

  // a reload while the last turn streams: {live, hydrated} once both settled
  async midturn() {
    const client = liveClient(options.base)
    await settle(client)
    const turns = options.turns
    for (const turn of turns.slice(0, -1)) await send(client, turn)
    let reloadedClient
    let started
    const reloadedSettled = new Promise((resolve) => (started = resolve))
    const unsubscribe = setInterval(() => {
      const last = client.getMessages().at(-1)
      const text = last?.role === 'assistant' ? last.parts.filter((p) => p.type === 'text').map((p) => p.content).join('') : ''
      if (!reloadedClient && text.length >= (options.reloadAfterChars ?? 10)) {
        reloadedClient = reloaded()
        started()
      }
    }, 10)
    await send(client, turns.at(-1))
    clearInterval(unsubscribe)
    if (!reloadedClient) fail('the turn ended before the reload')
    await reloadedSettled
    await settle(reloadedClient, 500)
    finish({ live: plain(client.getMessages()), hydrated: plain(reloadedClient.getMessages()) })
  },

  // a turn that asks for approval; a reload shows the request and answers it; a second
  // reload shows the answered thread:
  // {live, requested (the first reload's before it answers), answered, hydrated}
  async approval() {
    const liveMessages = await live()
    const first = reloaded()
    await settle(first)
    const requested = plain(first.getMessages())
    const id = approvalId(first)
    if (!id) fail(`no approval request after the reload: ${JSON.stringify(requested)}`)
    await first.addToolApprovalResponse({ id, approved: options.approved ?? true })
    await settle(first, 500)
    const answered = plain(first.getMessages())
    first.dispose()
    const second = reloaded()
    await settle(second)
    finish({ live: liveMessages, requested, answered, hydrated: plain(second.getMessages()) })
  },

  // clients on options.bases send options.turns each, at once, to one thread; then a reload
  // on the first base: {hydrated}
  async concurrent() {
    await Promise.all(
      options.bases.map(async (base, i) => {
        const client = liveClient(base)
        await settle(client)
        for (const turn of options.turns) await send(client, { ...turn, text: `${turn.text} from ${i}` })
        client.dispose()
      }),
    )
    const client = reloaded()
    await settle(client)
    finish({ hydrated: plain(client.getMessages()) })
  },

  // turns, then the live client's own regenerate (reload()) options.regenerates times, then a
  // reload: {live, hydrated}
  async regenerate() {
    const client = liveClient(options.base)
    await settle(client)
    for (const turn of options.turns) await send(client, turn)
    for (let i = 0; i < options.regenerates; i++) {
      await client.reload()
      await settle(client)
    }
    const liveMessages = plain(client.getMessages())
    client.dispose()
    const fresh = reloaded()
    await settle(fresh)
    finish({ live: liveMessages, hydrated: plain(fresh.getMessages()) })
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
