// The thread list of the side panel, and a thread's turns as the server keeps them
// (GET /api/threads, DELETE /api/threads/{id}, GET /api/chat?threadId=; docs/TRANSPORTS.md,
// "Threads").

import { approvalsOf, Status } from "./render.js";

/** listThreads returns the caller's threads, most recently updated first (one page). */
export async function listThreads() {
	const response = await fetch("api/threads?limit=50", { headers: { Accept: "application/json" } });
	if (!response.ok) throw new Error(`listing threads: ${response.status}`);
	return (await response.json()).threads ?? [];
}

/** deleteThread removes a thread with its run logs. */
export async function deleteThread(threadId) {
	const response = await fetch(`api/threads/${encodeURIComponent(threadId)}`, { method: "DELETE" });
	if (!response.ok && response.status !== 404) throw new Error(`deleting a thread: ${response.status}`);
}

/**
 * hydrate returns the thread's finished turns as TurnView records, and the run still running
 * with its user's message, if any: {turns, active: {runId, user, answer} | undefined}. The
 * thread's pending approval, if any, is the approval of the turn that holds its tool call. A
 * running run that comes after an answered approval, with no user's message since, is the
 * answer's continuation: active with the answer, and the turn it answers shown as it was.
 */
export async function hydrate(threadId) {
	const response = await fetch(`api/chat?threadId=${encodeURIComponent(threadId)}`, {
		headers: { Accept: "application/json" },
	});
	if (!response.ok) throw new Error(`hydrating the thread: ${response.status}`);
	const { messages = [], activeRun, interrupts } = await response.json();
	let active;
	let shown = messages;
	if (activeRun?.runId) {
		const at = messages.findLastIndex((m) => m.role === "user" || m.parts.some(answeredCall));
		if (at >= 0 && messages[at].role !== "user") {
			const call = messages[at].parts.findLast(answeredCall);
			const answer = { approved: call.approval.approved, toolName: call.name, toolCallId: call.id, args: call.arguments ?? "" };
			active = { runId: activeRun.runId, user: null, answer };
			shown = messages.slice(0, at + 1);
		}
	}
	const turns = turnsOf(shown);
	const pending = approvalsOf({ type: "interrupt", interrupts: interrupts?.pending });
	if (pending.length > 0) {
		const asks = turns.findLast((turn) => turn.blocks.some((b) => b.kind === "tool" && b.id === pending[0].toolCallId)) ?? turns.at(-1);
		if (asks) asks.approval = { runId: interrupts.runId, interrupts: pending };
	}
	if (activeRun?.runId && !active) {
		// The running turn is rendered again from the start of its log.
		const last = turns.at(-1);
		if (last) {
			turns.pop();
			active = { runId: activeRun.runId, user: last.user };
		}
	}
	return { turns, active };
}

/** answeredCall reports whether a message part is a tool call whose approval was answered. */
function answeredCall(part) {
	return part.type === "tool-call" && typeof part.approval?.approved === "boolean";
}

function textOf(message) {
	return message.parts
		.filter((part) => part.type === "text")
		.map((part) => part.content)
		.join("");
}

/** turnsOf groups UIMessages into turns: a user's message and the replies that follow it. */
function turnsOf(messages) {
	const turns = [];
	let turn;
	for (const message of messages) {
		if (message.role === "user" || !turn) {
			const user = message.role === "user" ? { id: message.id, content: textOf(message) } : { id: message.id, content: "" };
			turn = { runId: message.id, user, blocks: [], status: Status.done };
			turns.push(turn);
			if (message.role === "user") {
				if (message.metadata?.branch) turn.branch = message.metadata.branch;
				continue;
			}
		}
		// The reply's first message carries its place among the replies regenerated.
		if (message.metadata?.branch && turn.blocks.length === 0) turn.branch = message.metadata.branch;
		message.parts.forEach((part, i) => {
			const key = `${part.type}:${message.id}:${i}`;
			if (part.type === "text") {
				turn.blocks.push({ kind: "text", key, id: message.id, role: message.role, text: part.content, done: true });
			} else if (part.type === "thinking") {
				turn.blocks.push({ kind: "reasoning", key, id: message.id, text: part.content, done: true });
			} else if (part.type === "tool-call") {
				const call = { kind: "tool", key, id: part.id, name: part.name, args: part.arguments ?? "", done: true };
				if (part.output !== undefined) call.result = typeof part.output === "string" ? part.output : JSON.stringify(part.output);
				turn.blocks.push(call);
				if (answeredCall(part)) {
					const interrupt = { id: part.approval.id, toolCallId: part.id, reason: "approval_required", metadata: { kind: "approval", toolName: part.name } };
					turn.approval = { runId: "", interrupts: [interrupt], approved: part.approval.approved };
				}
			}
		});
	}
	return turns;
}
