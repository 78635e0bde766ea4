// The reference of the thread package's differential test: the real StreamProcessor of
// @tanstack/ai 0.58.0, driven as @tanstack/ai-client 0.33.2's ChatClient drives it.
//
//   node tanstack-builder.mjs < cases.ndjson > results.ndjson
//
// Each input line is one thread, {"id", "runs": [{"runId", "threadId", "before": [op...],
// "events": [AG-UI event...]}]}. For every run, the driver first applies the ops the client
// applies between runs (ChatClient's own calls on its processor):
//   {"op":"user","id","content"[,"metadata"]}    addUserMessage (sendMessage)
//   {"op":"approve","approvalId","approved"}     addToolApprovalResponse
//   {"op":"toolResult","toolCallId","output"[,"interruptId"]}
//                                                addToolResult (and, answering a client-tool
//                                                interrupt, a resume entry with the output)
//   {"op":"truncate","id"}                       removeMessagesAfter(index of id) (reload)
// then records the RunAgentInput the client posts (uiMessagesToWire of the messages, the
// resume entries of approvals), then prepareAssistantMessage(), processChunk(
// restoreInboundChunk(copy)) for every event, and finalizeStream() unless the run ended with
// RUN_ERROR. Output, one line per thread in input order: {"id", "inputs": [RunAgentInput...],
// "messages": [UIMessage...], "model": [ModelMessage...]} (createdAt as ISO strings; model:
// convertMessagesToModelMessages of the messages), or {"id", "error"}.
import readline from 'node:readline'
import { StreamProcessor, convertMessagesToModelMessages, restoreInboundChunk, uiMessagesToWire } from '@tanstack/ai/client'

// The processor warns on odd sequences (a tool result for an unknown call); the test reads
// only stdout.
console.warn = () => {}
console.error = () => {}

function runThread(thread) {
  const p = new StreamProcessor()
  const inputs = []
  for (const run of thread.runs) {
    const resume = []
    for (const op of run.before ?? []) {
      switch (op.op) {
        case 'user':
          p.addUserMessage(op.content, op.id, op.metadata)
          break
        case 'approve':
          p.addToolApprovalResponse(op.approvalId, op.approved)
          resume.push({ interruptId: op.approvalId, status: 'resolved', payload: { approved: op.approved } })
          break
        case 'toolResult':
          p.addToolResult(op.toolCallId, op.output)
          if (op.interruptId) resume.push({ interruptId: op.interruptId, status: 'resolved', payload: op.output })
          break
        case 'truncate': {
          const i = p.getMessages().findIndex((m) => m.id === op.id)
          p.removeMessagesAfter(i)
          break
        }
        default:
          throw new Error(`unknown op ${op.op}`)
      }
    }
    inputs.push({
      threadId: run.threadId ?? 't',
      runId: run.runId,
      messages: uiMessagesToWire(p.getMessages()),
      ...(resume.length > 0 ? { resume } : {}),
    })
    p.prepareAssistantMessage()
    let last
    for (const e of run.events) {
      last = restoreInboundChunk(structuredClone(e))
      p.processChunk(last)
    }
    if (last?.type !== 'RUN_ERROR') p.finalizeStream()
  }
  const messages = JSON.parse(JSON.stringify(p.getMessages()))
  return { id: thread.id, inputs, messages, model: convertMessagesToModelMessages(messages) }
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity })
const out = []
for await (const line of rl) {
  if (!line) continue
  let thread
  try {
    thread = JSON.parse(line)
    out.push(JSON.stringify(runThread(thread)))
  } catch (err) {
    out.push(JSON.stringify({ id: thread?.id ?? null, error: String(err?.stack ?? err) }))
  }
  if (out.length >= 256) {
    process.stdout.write(out.join('\n') + '\n')
    out.length = 0
  }
}
if (out.length > 0) process.stdout.write(out.join('\n') + '\n')
