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
 * with its user's message, if any: {turns, active: {runId, user} | undefined}. The thread's
 * pending approval, if any, is the approval of the turn that holds its tool call.
 */
export async function hydrate(threadId) {
	const response = await fetch(`api/chat?threadId=${encodeURIComponent(threadId)}`, {
		headers: { Accept: "application/json" },
	});
	if (!response.ok) throw new Error(`hydrating the thread: ${response.status}`);
	const { messages = [], activeRun, interrupts } = await response.json();
	const turns = turnsOf(messages);
	const pending = approvalsOf({ type: "interrupt", interrupts: interrupts?.pending });
	if (pending.length > 0) {
		const asks = turns.findLast((turn) => turn.blocks.some((b) => b.kind === "tool" && b.id === pending[0].toolCallId)) ?? turns.at(-1);
		if (asks) asks.approval = { runId: interrupts.runId, interrupts: pending };
	}
	let active;
	if (activeRun?.runId) {
		// The running turn is rendered again from the start of its log.
		const last = turns.at(-1);
		if (last) {
			turns.pop();
			active = { runId: activeRun.runId, user: last.user };
		}
	}
	return { turns, active };
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
			if (message.role === "user") continue;
		}
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
			}
		});
	}
	return turns;
}
