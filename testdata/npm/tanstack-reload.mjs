// A reload mid-run through the real ChatClient of @tanstack/ai-client 0.33.2, for the thread
// package's tests: a client created with persistence: true hydrates from a given answer (what
// the gateway's hydrate would return), then rejoins the active run, whose log the connection's
// joinRun replays from its start (as GET ?runId=R&offset=-1 does).
//
//   node tanstack-reload.mjs < cases.ndjson > results.ndjson
//
// Each input line is {"id", "hydrate": {messages, activeRun, interrupts, page}, "replay":
// [AG-UI event...]}; each output line {"id", "messages": [UIMessage...], "joined": n} (n: how
// many times the client called joinRun), or {"id", "error"}. Every case is bounded to 5 s.
//
// A line {"id", "pageSize": n, "pages": {"<before>": answer, ...}} pages instead: the client,
// created with history: {pageSize: n}, hydrates (answer "" when it sends no before), then
// calls loadOlderMessages until it has no older messages; hydrate answers pages[before] and
// fails unless the client asks for limit n. The output also counts the hydrate calls ("calls").
import readline from 'node:readline'
import { ChatClient } from '@tanstack/ai-client'

console.warn = () => {}
console.error = () => {}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0))

async function reload(c) {
  let hydrated = false
  let joined = 0
  let replayed = false
  const client = new ChatClient({
    threadId: 't',
    persistence: true,
    connection: {
      async *connect() {},
      async hydrate() {
        hydrated = true
        return structuredClone(c.hydrate)
      },
      async *joinRun() {
        joined++
        for (const e of c.replay) yield structuredClone(e)
        replayed = true
      },
    },
  })
  client.attach()
  const deadline = Date.now() + 5000
  const done = () => hydrated && (!c.hydrate.activeRun || replayed) && !client.getIsLoading()
  while (!done()) {
    if (Date.now() > deadline) throw new Error('the client did not settle within 5 s')
    await tick()
  }
  // Let the last chunk's processing and the hydration's continuation finish.
  for (let i = 0; i < 10; i++) await tick()
  const messages = JSON.parse(JSON.stringify(client.getMessages()))
  client.detach()
  return { id: c.id, messages, joined }
}

async function page(c) {
  let calls = 0
  let hydrated = false
  const client = new ChatClient({
    threadId: 't',
    persistence: true,
    history: { pageSize: c.pageSize },
    connection: {
      async *connect() {},
      async hydrate(_threadId, options) {
        calls++
        if (options?.limit !== c.pageSize) throw new Error(`hydrate asked for limit ${options?.limit}`)
        const answer = c.pages[options?.before ?? '']
        if (!answer) throw new Error(`no page before ${JSON.stringify(options?.before)}`)
        hydrated = true
        return structuredClone(answer)
      },
    },
  })
  client.attach()
  const deadline = Date.now() + 5000
  while (!hydrated) {
    if (Date.now() > deadline) throw new Error('the client did not hydrate within 5 s')
    await tick()
  }
  for (let i = 0; i < 10; i++) await tick()
  while (client.getHasOlderMessages()) {
    if (Date.now() > deadline) throw new Error('the client did not page within 5 s')
    await client.loadOlderMessages()
  }
  const messages = JSON.parse(JSON.stringify(client.getMessages()))
  client.detach()
  return { id: c.id, messages, calls }
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity })
for await (const line of rl) {
  if (!line) continue
  let c
  try {
    c = JSON.parse(line)
    process.stdout.write(JSON.stringify(await (c.pages ? page(c) : reload(c))) + '\n')
  } catch (err) {
    process.stdout.write(JSON.stringify({ id: c?.id ?? null, error: String(err?.stack ?? err) }) + '\n')
  }
}
