// The published Node reference server of the Durable Streams protocol, for side-by-side runs
// with cmd/dsbench: @durable-streams/server's DurableStreamTestServer, in memory (or, with
// --data-dir, its file-backed store).
//
//   node testdata/durable/reference-server.mjs [--addr 127.0.0.1:4437] [--data-dir DIR] [--long-poll-ms 20000]
//
// It prints one line {"msg":"listening","url":"http://host:port","pid":N} on stdout when
// ready and exits on SIGTERM or SIGINT.
import { DurableStreamTestServer } from '@durable-streams/server'

function flag(name, def) {
  const i = process.argv.indexOf(name)
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : def
}

const addr = flag('--addr', '127.0.0.1:4437')
const sep = addr.lastIndexOf(':')
const server = new DurableStreamTestServer({
  host: addr.slice(0, sep),
  port: Number(addr.slice(sep + 1)),
  dataDir: flag('--data-dir', undefined),
  longPollTimeout: Number(flag('--long-poll-ms', '20000')),
})
const url = await server.start()
process.stdout.write(JSON.stringify({ msg: 'listening', url, pid: process.pid }) + '\n')

async function shutdown() {
  setTimeout(() => process.exit(0), 2000).unref()
  await server.stop()
  process.exit(0)
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)
