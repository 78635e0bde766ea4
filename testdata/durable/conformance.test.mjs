import { runConformanceTests } from '@durable-streams/server-conformance-tests'
runConformanceTests({ baseUrl: process.env.DS_BASE_URL, longPollTimeoutMs: Number(process.env.DS_LONG_POLL_MS || 20000) })
