// Rendering of one turn: the user's message and the AG-UI events of the reply.
//
// A TurnView keeps a small model of what it shows (blocks: reasoning, tool calls, text) and
// the DOM built from it. The model is what the page stores between reloads (toJSON /
// TurnView.restore) and what the next turn sends back as history (messages()).
//
// A turn that ends asking for approval (RUN_FINISHED with an interrupt outcome whose interrupts
// have reason approval_required) shows Approve and Deny buttons; pressing one dispatches an
// "approval" event ({detail: {view, approved}}, bubbling) from the turn, which the page answers
// with a continuation run (and view.answered, which disables the buttons). A continuation is a turn whose user bubble says the answer.

/** Status of a turn as shown to the user. */
export const Status = Object.freeze({
	running: "running",
	done: "done",
	stopped: "stopped",
	error: "error",
});

const statusText = {
	[Status.running]: "",
	[Status.done]: "",
	[Status.stopped]: "Stopped",
	[Status.error]: "Failed",
};

function el(tag, attrs = {}, ...children) {
	const node = document.createElement(tag);
	for (const [key, value] of Object.entries(attrs)) {
		if (value === undefined || value === false) continue;
		if (key === "class") node.className = value;
		else if (key === "text") node.textContent = value;
		else node.setAttribute(key, value === true ? "" : String(value));
	}
	node.append(...children);
	return node;
}

/** prettyJSON indents a JSON text; anything else is returned unchanged. */
export function prettyJSON(text) {
	try {
		return JSON.stringify(JSON.parse(text), null, 2);
	} catch {
		return text;
	}
}

/** contentText flattens a TOOL_CALL_RESULT content (a string or content parts) to text. */
export function contentText(content) {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return JSON.stringify(content);
	return content
		.map((part) => (part && part.type === "text" ? part.text : `[${part?.type ?? "part"}]`))
		.join("");
}

/** bubbleText is the user bubble of a turn: the message, the answer it continues, or neither. */
function bubbleText(user, answer) {
	if (user) return user.content;
	if (answer) return `${answer.approved ? "Approved" : "Denied"} ${answer.toolName}`;
	return "Sent from another tab or device";
}

/** approvalsOf returns the interrupts of a RUN_FINISHED outcome that ask for an approval. */
export function approvalsOf(outcome) {
	if (outcome?.type !== "interrupt" || !Array.isArray(outcome.interrupts)) return [];
	return outcome.interrupts.filter(
		(i) => typeof i?.id === "string" && (i.reason === "approval_required" || i.metadata?.kind === "approval"),
	);
}

export class TurnView {
	/**
	 * @param {{runId: string, user: {id: string, content: string}|null}} turn  user is null
	 *   for a turn started elsewhere (another tab, another device, a server), whose message this
	 *   page never saw
	 */
	constructor({ runId, user, answer }) {
		this.runId = runId;
		this.user = user;
		/** The answer to an approval this turn continues ({approved, toolName, toolCallId, args}). */
		this.answer = answer;
		/**
		 * What the turn asks to approve: {runId (the paused run), interrupts, approved
		 * (undefined until answered)}; undefined for a turn that asks nothing.
		 */
		this.approval = undefined;
		this.approvalBox = undefined;
		this.blocks = [];
		this.status = Status.running;
		this.error = undefined;
		this.notes = [];
		/** Live DOM parts of blocks, by block key. */
		this.parts = new Map();
		this.roles = new Map(); // role of each started text message
		this.openSpan = undefined;

		this.body = el("div", { class: "reply-body" });
		this.statusLine = el("p", { class: "turn-status", "data-role": "status" });
		this.noteLine = el("p", { class: "turn-note", "data-role": "note", hidden: true });
		this.typing = el("span", { class: "typing", "aria-hidden": "true" }, el("span"), el("span"), el("span"));
		/** Where the reply stands among its siblings ({index, count, siblings}; docs/THREADS.md section 7). */
		this.branch = undefined;
		this.branchNav = el("div", { class: "branch-nav", "data-role": "branch", hidden: true });
		this.regenerateButton = el("button", { type: "button", class: "ghost", "data-role": "regenerate", hidden: true, text: "Regenerate" });
		this.regenerateButton.addEventListener("click", () => this.root.dispatchEvent(new CustomEvent("regenerate", { bubbles: true, detail: { view: this } })));
		this.reply = el(
			"div",
			{ class: "msg assistant", "data-role": "reply", "aria-busy": "true" },
			el("h3", { class: "visually-hidden", text: "Assistant" }),
			this.body,
			this.typing,
			this.noteLine,
			this.statusLine,
			el("div", { class: "turn-actions" }, this.branchNav, this.regenerateButton),
		);
		this.root = el(
			"article",
			{ class: "turn", "data-run-id": runId, "data-status": this.status },
			el(
				"div",
				{ class: "msg user", "data-role": "user", "data-elsewhere": user ? undefined : "true" },
				el("h3", { class: "visually-hidden", text: "You" }),
				el("p", { class: "bubble", text: bubbleText(user, answer) }),
			),
			this.reply,
		);
	}

	/** restore rebuilds a finished (or stored) turn from toJSON's output. */
	static restore(record) {
		const view = new TurnView(record);
		for (const block of record.blocks ?? []) view.addBlock(structuredClone(block));
		for (const note of record.notes ?? []) view.note(note);
		view.finish(record.status ?? Status.done, record.error);
		if (record.approval) view.ask(record.approval);
		if (record.branch) view.showBranch(record.branch);
		return view;
	}

	toJSON() {
		return {
			runId: this.runId,
			user: this.user,
			answer: this.answer,
			blocks: this.blocks,
			status: this.status,
			error: this.error,
			notes: this.notes,
			approval: this.approval,
			branch: this.branch,
		};
	}

	/**
	 * showBranch shows ‹ i / n › for a reply with siblings ({index, count, siblings}: 1-based,
	 * siblings the ids of each one's first message); pressing ‹ or › dispatches a "branch" event
	 * ({detail: {messageId}}, bubbling) naming the sibling to show.
	 */
	showBranch(branch) {
		this.branch = branch;
		const nav = this.branchNav;
		nav.replaceChildren();
		nav.hidden = !(branch?.count > 1);
		if (nav.hidden) return;
		const go = (i) => () => {
			const messageId = branch.siblings?.[i - 1];
			if (messageId) this.root.dispatchEvent(new CustomEvent("branch", { bubbles: true, detail: { messageId } }));
		};
		const prev = el("button", { type: "button", class: "ghost", "data-role": "branch-prev", "aria-label": "Previous reply", text: "‹", disabled: branch.index <= 1 });
		const next = el("button", { type: "button", class: "ghost", "data-role": "branch-next", "aria-label": "Next reply", text: "›", disabled: branch.index >= branch.count });
		prev.addEventListener("click", go(branch.index - 1));
		next.addEventListener("click", go(branch.index + 1));
		nav.append(prev, el("span", { "data-role": "branch-position", text: `${branch.index} / ${branch.count}` }), next);
	}

	get running() {
		return this.status === Status.running;
	}

	/** reset forgets what was rendered of the reply (before replaying it from the start). */
	reset() {
		this.blocks = [];
		this.parts.clear();
		this.roles.clear();
		this.openSpan = undefined;
		this.body.replaceChildren();
		this.error = undefined;
		this.approval = undefined;
		this.approvalBox?.remove();
		this.approvalBox = undefined;
		this.setStatus(Status.running);
	}

	/** apply renders one AG-UI event of the turn. */
	apply(event) {
		switch (event.type) {
			case "RUN_STARTED":
				if (!this.running || this.root.dataset.queued) this.setStatus(Status.running);
				break;
			case "CUSTOM":
				if (event.name === "run.queued") this.queued(event.value?.ahead);
				break;
			case "TEXT_MESSAGE_START":
				// The text shows where its first content comes: after the reasoning and tool
				// calls that an agent sends between a message's start and its text.
				this.roles.set(event.messageId, event.role);
				break;
			case "TEXT_MESSAGE_CONTENT":
				this.appendText(this.text(event.messageId, this.roles.get(event.messageId)), event.delta);
				break;
			case "TEXT_MESSAGE_END":
				this.text(event.messageId, this.roles.get(event.messageId)).done = true;
				break;
			case "REASONING_START":
				this.openSpan = this.reasoning(event.messageId);
				break;
			case "REASONING_MESSAGE_START": {
				const span = this.openSpan;
				if (span && !span.messageId && !this.parts.has(`reasoning:${event.messageId}`)) {
					span.messageId = event.messageId;
					this.parts.set(`reasoning:${event.messageId}`, this.parts.get(span.key));
				} else {
					this.reasoning(event.messageId).messageId = event.messageId;
				}
				break;
			}
			case "REASONING_MESSAGE_CONTENT":
				this.appendText(this.reasoning(event.messageId), event.delta);
				break;
			case "REASONING_MESSAGE_END":
				this.endReasoning(this.reasoning(event.messageId));
				break;
			case "REASONING_END":
				if (this.openSpan) this.endReasoning(this.openSpan);
				this.openSpan = undefined;
				break;
			case "TOOL_CALL_START": {
				const call = this.tool(event.toolCallId);
				call.name = event.toolCallName;
				if (event.parentMessageId !== undefined) call.parentMessageId = event.parentMessageId;
				this.parts.get(call.key).name.textContent = call.name;
				break;
			}
			case "TOOL_CALL_ARGS": {
				const call = this.tool(event.toolCallId);
				call.args += event.delta;
				this.parts.get(call.key).args.textContent = call.args;
				break;
			}
			case "TOOL_CALL_END": {
				const call = this.tool(event.toolCallId);
				call.done = true;
				this.renderTool(call);
				break;
			}
			case "TOOL_CALL_RESULT": {
				const answer = this.answer;
				if (answer?.toolCallId === event.toolCallId && !this.parts.has(`tool:${event.toolCallId}`)) {
					// The result of the approved call, which the paused turn shows: named here too.
					this.addBlock({ kind: "tool", key: `tool:${event.toolCallId}`, id: event.toolCallId, name: answer.toolName, args: answer.args ?? "", done: true });
				}
				const call = this.tool(event.toolCallId);
				call.result = contentText(event.content);
				call.resultId = event.messageId;
				this.renderTool(call);
				break;
			}
			case "RUN_FINISHED": {
				this.finish(Status.done);
				const interrupts = approvalsOf(event.outcome);
				if (interrupts.length > 0) this.ask({ runId: event.runId ?? this.runId, interrupts });
				break;
			}
			case "RUN_ERROR":
				if (event.code === "aborted") this.finish(Status.stopped);
				else this.finish(Status.error, { message: event.message, code: event.code });
				break;
			default:
				// Steps, state, activity and the other CUSTOM events (run.accepted) change nothing shown.
				break;
		}
	}

	/** finish ends the turn with a status (and, for an error, what went wrong). */
	finish(status, error) {
		this.error = error;
		this.setStatus(status);
		for (const block of this.blocks) {
			if (block.kind === "reasoning" && !block.done) this.endReasoning(block);
			if (block.kind === "tool") this.renderTool(block);
		}
	}

	/**
	 * ask shows what the turn asks to approve ({runId, interrupts, approved}), with Approve and
	 * Deny buttons while it is unanswered.
	 */
	ask(approval) {
		this.approval = approval;
		this.approvalBox?.remove();
		const names = [...new Set(approval.interrupts.map((i) => i.metadata?.toolName ?? this.toolName(i.toolCallId)))];
		const question = el("p", { class: "approval-question", text: `Allow the call to ${names.join(", ")}?` });
		const approve = el("button", { type: "button", class: "primary", "data-role": "approve", text: "Approve" });
		const deny = el("button", { type: "button", class: "danger", "data-role": "deny", text: "Deny" });
		const outcome = el("p", { class: "approval-answer", "data-role": "approval-answer", role: "status" });
		const group = el(
			"div",
			{ class: "approval", role: "group", "data-role": "approval", "aria-label": "Approval needed" },
			question,
			el("div", { class: "approval-actions" }, approve, deny),
			outcome,
		);
		const answer = (approved) => {
			if (this.approval?.approved !== undefined) return;
			this.root.dispatchEvent(new CustomEvent("approval", { bubbles: true, detail: { view: this, approved } }));
		};
		approve.addEventListener("click", () => answer(true));
		deny.addEventListener("click", () => answer(false));
		this.approvalBox = group;
		this.reply.insertBefore(group, this.typing);
		this.showAnswer();
		for (const block of this.blocks) if (block.kind === "tool") this.renderTool(block);
	}

	/**
	 * answered records the answer to the approval (true, false, or null: answered elsewhere)
	 * and disables its buttons.
	 */
	answered(approved) {
		if (!this.approval) return;
		this.approval.approved = approved;
		this.showAnswer();
		for (const block of this.blocks) if (block.kind === "tool") this.renderTool(block);
	}

	showAnswer() {
		const approved = this.approval?.approved;
		const box = this.approvalBox;
		if (!box) return;
		for (const button of box.querySelectorAll("button")) button.disabled = approved !== undefined;
		const outcome = box.querySelector("[data-role=approval-answer]");
		outcome.textContent = { true: "Approved", false: "Denied", null: "Answered elsewhere" }[approved] ?? "";
		outcome.hidden = approved === undefined;
	}

	/** toolName returns the name of the tool call id shown in this turn, or "a tool". */
	toolName(id) {
		return this.blocks.find((b) => b.kind === "tool" && b.id === id)?.name || "a tool";
	}

	/** stopping says a stop was asked for, until the turn ends. */
	stopping() {
		if (!this.running) return;
		this.statusLine.textContent = "Stopping…";
		this.statusLine.hidden = false;
		this.statusLine.setAttribute("role", "status");
	}

	/** note adds a line about the delivery of this turn (reconnected, rejoined). */
	note(text) {
		if (this.notes.at(-1) === text) return;
		this.notes.push(text);
		this.noteLine.hidden = false;
		this.noteLine.textContent = this.notes.join(" · ");
	}

	/** text returns the model of the text message id, creating it (and its DOM) if new. */
	text(id, role) {
		const key = `text:${id}`;
		const known = this.parts.get(key);
		if (known) return known.block;
		return this.addBlock({ kind: "text", key, id, role: role ?? "assistant", text: "", done: false });
	}

	reasoning(id) {
		const key = `reasoning:${id}`;
		const known = this.parts.get(key);
		if (known) return known.block;
		return this.addBlock({ kind: "reasoning", key, id, text: "", done: false });
	}

	tool(id) {
		const key = `tool:${id}`;
		const known = this.parts.get(key);
		if (known) return known.block;
		return this.addBlock({ kind: "tool", key, id, name: "", args: "", done: false });
	}

	addBlock(block) {
		this.blocks.push(block);
		let part;
		switch (block.kind) {
			case "text": {
				const node = document.createTextNode(block.text);
				const root = el("div", { class: "text", "data-role": "assistant-text", "data-message-id": block.id }, node);
				if (block.role !== "assistant") root.dataset.messageRole = block.role;
				part = { block, root, node };
				break;
			}
			case "reasoning": {
				const node = document.createTextNode(block.text);
				const label = el("span", { text: block.done ? "Reasoning" : "Thinking…" });
				const root = el(
					"details",
					{ class: "reasoning", "data-role": "reasoning" },
					el("summary", {}, label),
					el("div", { class: "reasoning-text" }, node),
				);
				part = { block, root, node, label };
				break;
			}
			case "tool": {
				const name = el("code", { class: "tool-name", text: block.name });
				const state = el("span", { class: "tool-state" });
				const args = el("pre", { class: "tool-args", "data-role": "tool-args", text: block.args });
				const result = el("pre", { class: "tool-result", "data-role": "tool-result" });
				const resultWrap = el("div", { class: "tool-section", hidden: true }, el("h4", { text: "Result" }), result);
				const root = el(
					"details",
					{ class: "tool", "data-role": "tool-call", open: true },
					el("summary", {}, el("span", { class: "tool-label", text: "Tool call" }), " ", name, " ", state),
					el("div", { class: "tool-section" }, el("h4", { text: "Arguments" }), args),
					resultWrap,
				);
				part = { block, root, name, state, args, result, resultWrap };
				break;
			}
			default:
				return block;
		}
		this.parts.set(block.key, part);
		this.body.append(part.root);
		if (block.kind === "tool") this.renderTool(block);
		return block;
	}

	appendText(block, delta) {
		if (typeof delta !== "string" || delta === "") return;
		block.text += delta;
		this.parts.get(block.key).node.appendData(delta);
	}

	endReasoning(block) {
		block.done = true;
		const part = this.parts.get(block.key);
		if (part) part.label.textContent = "Reasoning";
	}

	renderTool(call) {
		const part = this.parts.get(call.key);
		part.name.textContent = call.name;
		if (call.done) part.args.textContent = prettyJSON(call.args);
		if (call.result !== undefined) {
			part.resultWrap.hidden = false;
			part.result.textContent = prettyJSON(call.result);
		}
		let state = "streaming…";
		if (call.result !== undefined) state = "done";
		else if (this.approval?.interrupts.some((i) => i.toolCallId === call.id)) {
			state = { true: "approved", false: "denied", null: "answered" }[this.approval.approved] ?? "awaiting approval";
		} else if (call.done) state = this.running ? "waiting for result" : "called";
		part.state.textContent = state;
	}

	/** queued shows that the turn waits for ahead turns of the thread to end before it starts. */
	queued(ahead) {
		this.root.dataset.queued = "true";
		this.typing.hidden = true;
		const n = Number.isInteger(ahead) && ahead > 0 ? ahead : 1;
		this.statusLine.textContent = `Queued: ${n} ${n === 1 ? "reply" : "replies"} ahead`;
		this.statusLine.hidden = false;
		this.statusLine.setAttribute("role", "status");
	}

	setStatus(status) {
		delete this.root.dataset.queued;
		this.status = status;
		this.root.dataset.status = status;
		this.reply.setAttribute("aria-busy", String(status === Status.running));
		this.typing.hidden = status !== Status.running;
		let text = statusText[status];
		if (status === Status.error && this.error) {
			text = `Error: ${this.error.message}${this.error.code ? ` (${this.error.code})` : ""}`;
		}
		this.statusLine.textContent = text;
		this.statusLine.hidden = text === "";
		this.statusLine.setAttribute("role", status === Status.error ? "alert" : "status");
	}

	/**
	 * messages returns the AG-UI messages of this turn for the next turn's history: the user's
	 * message, then the reply's reasoning, assistant messages (with the tool calls that got a
	 * result) and tool results, in the order they appeared.
	 */
	messages() {
		const out = this.user ? [{ id: this.user.id, role: "user", content: this.user.content }] : [];
		const assistants = new Map();
		const assistant = (id) => {
			let message = assistants.get(id);
			if (!message) {
				message = { id, role: "assistant" };
				assistants.set(id, message);
				out.push(message);
			}
			return message;
		};
		for (const block of this.blocks) {
			if (block.kind === "reasoning" && block.text !== "") {
				out.push({ id: block.messageId ?? block.id, role: "reasoning", content: block.text });
			} else if (block.kind === "text") {
				if (block.role === "assistant") {
					const message = assistant(block.id);
					message.content = (message.content ?? "") + block.text;
				} else if (block.text !== "") {
					out.push({ id: block.id, role: block.role, content: block.text });
				}
			} else if (block.kind === "tool" && block.result !== undefined) {
				const message = assistant(block.parentMessageId ?? `${block.id}-call`);
				message.toolCalls ??= [];
				message.toolCalls.push({ id: block.id, type: "function", function: { name: block.name, arguments: block.args } });
				out.push({ id: block.resultId ?? `${block.id}-result`, role: "tool", toolCallId: block.id, content: block.result });
			}
		}
		return out.filter((m) => m.role !== "assistant" || (m.content ?? "") !== "" || m.toolCalls);
	}
}
