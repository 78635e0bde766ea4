// The chat page: composer, options, theme, the conversation and what survives a reload.
//
// sessionStorage keeps the thread (its id and every turn shown) and marks a turn that was
// still running; after a reload the page rejoins such a turn from the start of its log
// (offset -1) and renders it from scratch, so it is shown once, to its end. The side panel
// lists the threads the server keeps; choosing one shows it as the server has it (from any
// tab or device), and rejoins its running turn.
//
// A message sent while a reply streams is queued behind it (multitaskStrategy enqueue): its
// turn shows "Queued" until the server starts it, once the turns before it have ended.
//
// The page follows its thread: a turn of the thread started elsewhere (another tab on the
// same thread, another device, a server) streams here too. The thread's id is in the
// address (#thread=<id>): a tab, browser or device opened on that address shows the thread as
// the server keeps it, then its turns as they stream.
//
// A turn that ends asking to approve a tool call shows Approve and Deny buttons; the answer
// is a continuation run (parentRunId the paused run, resume answering its interrupts), shown
// as a turn of its own. The question survives a reload (sessionStorage) and is shown again
// from the server's thread (its pending interrupts) in another tab or browser.

import { Conversation } from "./conversation.js";
import { Status, TurnView } from "./render.js";
import { deleteThread, hydrate, listThreads } from "./threads.js";

const threadKey = "wsgateway.thread";
const optionsKey = "wsgateway.demo";
const themeKey = "wsgateway.theme";

const $ = (selector) => document.querySelector(selector);
const log = $("#conversation");
const empty = $("#empty");
const form = $("#composer");
const prompt = $("#prompt");
const sendButton = $("#send");
const stopButton = $("#stop");
const connection = $("#connection");
const options = $("#options");
const themeToggle = $("#theme-toggle");
const newThread = $("#new-thread");
const threadList = $("#thread-list");

/** randomId returns a fresh id with a readable prefix. */
function randomId(prefix) {
	const bytes = crypto.getRandomValues(new Uint8Array(6));
	const suffix = Array.from(bytes, (b) => b.toString(36).padStart(2, "0")).join("").slice(0, 8);
	return `${prefix}-${Date.now()}-${suffix}`;
}

// ---- theme ----

function applyTheme(theme) {
	if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
	else delete document.documentElement.dataset.theme;
	const dark = effectiveTheme() === "dark";
	themeToggle.setAttribute("aria-pressed", String(dark));
	themeToggle.title = dark ? "Switch to the light theme" : "Switch to the dark theme";
}

function effectiveTheme() {
	const chosen = document.documentElement.dataset.theme;
	if (chosen) return chosen;
	return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

themeToggle.addEventListener("click", () => {
	const next = effectiveTheme() === "dark" ? "light" : "dark";
	localStorage.setItem(themeKey, next);
	applyTheme(next);
});
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => applyTheme(localStorage.getItem(themeKey)));
applyTheme(localStorage.getItem(themeKey));

// ---- demo agent options ----

/** demoOptions reads the options panel into forwardedProps.demo (unset fields are left out). */
function demoOptions() {
	const demo = {};
	const tokens = options.elements.tokens.value.trim();
	const interval = options.elements.intervalMs.value.trim();
	if (tokens !== "") demo.tokens = Math.max(0, Math.trunc(Number(tokens)));
	if (interval !== "") demo.intervalMs = Math.max(0, Math.trunc(Number(interval)));
	if (options.elements.toolCall.checked) demo.toolCall = true;
	if (options.elements.reasoning.checked) demo.reasoning = true;
	if (options.elements.approval.checked) demo.approval = true;
	return demo;
}

function saveOptions() {
	const { tokens, intervalMs, toolCall, reasoning, approval } = options.elements;
	sessionStorage.setItem(
		optionsKey,
		JSON.stringify({
			tokens: tokens.value,
			intervalMs: intervalMs.value,
			toolCall: toolCall.checked,
			reasoning: reasoning.checked,
			approval: approval.checked,
		}),
	);
}

function loadOptions() {
	let saved;
	try {
		saved = JSON.parse(sessionStorage.getItem(optionsKey) ?? "null");
	} catch {
		saved = null;
	}
	if (!saved) return;
	const { tokens, intervalMs, toolCall, reasoning, approval } = options.elements;
	tokens.value = saved.tokens ?? "";
	intervalMs.value = saved.intervalMs ?? "";
	toolCall.checked = Boolean(saved.toolCall);
	reasoning.checked = Boolean(saved.reasoning);
	approval.checked = Boolean(saved.approval);
}

options.addEventListener("input", saveOptions);
options.addEventListener("submit", (event) => event.preventDefault());
loadOptions();

// ---- the thread ----

/** @type {{threadId: string, views: TurnView[]}} */
const thread = { threadId: "", views: [] };
const views = new Map();

function saveThread() {
	const record = { threadId: thread.threadId, turns: thread.views.map((view) => view.toJSON()) };
	try {
		sessionStorage.setItem(threadKey, JSON.stringify(record));
	} catch {
		// Storage full or disabled: the conversation goes on, a reload starts afresh.
	}
}

function loadThread() {
	try {
		return JSON.parse(sessionStorage.getItem(threadKey) ?? "null");
	} catch {
		return null;
	}
}

function addView(view) {
	thread.views.push(view);
	views.set(view.runId, view);
	log.append(view.root);
	empty.hidden = true;
}

function history() {
	return thread.views.flatMap((view) => view.messages());
}

function runningView() {
	return thread.views.find((view) => view.running);
}

function refreshComposer() {
	const running = runningView() !== undefined;
	stopButton.hidden = !running;
	sendButton.disabled = prompt.value.trim() === "";
	document.body.dataset.busy = String(running);
	// Regenerate: on the last reply, once no turn runs, for a turn whose message this page has.
	const last = thread.views.at(-1);
	for (const view of thread.views) view.regenerateButton.hidden = running || view !== last || !view.user || view.answer !== undefined;
}

const stickToBottom = () => {
	const scroller = document.scrollingElement;
	return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
};

function scrollToEnd() {
	document.scrollingElement.scrollTop = document.scrollingElement.scrollHeight;
}

// followReply keeps the newest text in view while it streams, if the reader is at the bottom;
// once per frame, however many events arrive.
let followPending = false;
function followReply() {
	if (followPending) return;
	followPending = true;
	const follow = stickToBottom();
	requestAnimationFrame(() => {
		followPending = false;
		if (follow) scrollToEnd();
	});
}

// ---- connection ----

const stateText = {
	connecting: "Connecting…",
	connected: "Connected",
	reconnecting: "Reconnecting…",
	resumed: "Resumed",
	offline: "Offline",
};

/** Runs whose live delivery was lost in this page (a later resume is shown as such). */
const dropped = new Set();

const conversation = new Conversation({
	onEvent(runId, event) {
		const view = views.get(runId);
		if (!view) return;
		const wasRunning = view.running;
		view.apply(event);
		if (event.type === "RUN_STARTED" && typeof event.parentRunId === "string") {
			// A continuation answers the approval its parent run asked for, here or elsewhere.
			const paused = thread.views.find((v) => v.approval?.runId === event.parentRunId && v.approval.approved === undefined);
			if (paused) {
				paused.answered(null);
				saveThread();
			}
		}
		if (wasRunning !== view.running) {
			saveThread();
			refreshComposer();
			showBranchChanged();
		}
		followReply();
	},
	onDone(runId) {
		const view = views.get(runId);
		if (!view) return;
		if (view.running) view.finish(Status.error, { message: "the reply ended without a final event", code: "incomplete" });
		saveThread();
		refreshComposer();
		refreshThreads();
		showBranchChanged();
	},
	onFail(runId, message, code) {
		const view = views.get(runId);
		if (!view) return;
		if (code === "detached") {
			view.note("Stopped following this reply; the agent may still be writing it");
			view.finish(Status.stopped);
		} else if (view.running) {
			view.finish(Status.error, { message, code });
		}
		saveThread();
		refreshComposer();
	},
	onDrop(runId) {
		dropped.add(runId);
		views.get(runId)?.note("Connection lost, reconnecting…");
	},
	onResume(runId) {
		if (dropped.has(runId)) views.get(runId)?.note("Resumed");
	},
	onFollow(runId) {
		// A turn of this thread started elsewhere: shown from its start, once.
		if (views.has(runId)) return false;
		addView(new TurnView({ runId, user: null }));
		saveThread();
		refreshComposer();
		followReply();
		return true;
	},
	onBranch({ threadId }) {
		// The thread's active branch changed (a regenerate's reply ended, a switch on any
		// device): shown as the server keeps it, once no turn of this page runs.
		if (threadId !== thread.threadId) return;
		if (runningView()) branchChanged = true;
		else showThread(threadId);
	},
	onState(state) {
		connection.dataset.state = state;
		connection.querySelector("[data-role=state-text]").textContent = stateText[state] ?? state;
	},
});

// ---- composer ----

function send(text) {
	const user = { id: randomId("msg"), content: text };
	const runId = randomId("run");
	// A message sent while a reply streams waits for it on the server (multitaskStrategy
	// enqueue), which gives the agent the thread as it is when the message's turn starts:
	// the new message alone is posted, not a reply still being written.
	const newMessage = { id: user.id, role: "user", content: text };
	const messages = runningView() ? [newMessage] : [...history(), newMessage];
	const view = new TurnView({ runId, user });
	addView(view);
	saveThread();
	conversation.start({
		threadId: thread.threadId,
		runId,
		messages,
		tools: [],
		context: [],
		forwardedProps: { demo: demoOptions() },
		multitaskStrategy: "enqueue",
	});
	refreshComposer();
	scrollToEnd();
}

/**
 * answerApproval answers what view asks to approve with a continuation run: a new run of the
 * thread whose parentRunId is the paused run and whose resume resolves each interrupt with
 * payload.approved.
 */
function answerApproval(view, approved) {
	const { runId: parentRunId, interrupts } = view.approval;
	const runId = randomId("run");
	const messages = history();
	const first = interrupts[0];
	const toolName = first?.metadata?.toolName ?? view.toolName(first?.toolCallId);
	const args = view.blocks.find((b) => b.kind === "tool" && b.id === first?.toolCallId)?.args;
	addView(new TurnView({ runId, user: null, answer: { approved, toolName, toolCallId: first?.toolCallId, args } }));
	saveThread();
	conversation.start({
		threadId: thread.threadId,
		runId,
		parentRunId,
		messages,
		tools: [],
		context: [],
		forwardedProps: { demo: demoOptions() },
		resume: interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: { approved } })),
	});
	refreshComposer();
	scrollToEnd();
}

/** branchChanged is set when the thread's active branch changed while a turn of this page ran. */
let branchChanged = false;

/** showBranchChanged shows the thread as the server keeps it once no turn runs, if its branch changed meanwhile. */
function showBranchChanged() {
	if (branchChanged && !runningView()) {
		branchChanged = false;
		showThread(thread.threadId);
	}
}

/**
 * regenerate answers the last turn's message again: a new run posting the thread up to that
 * message, which the server answers anew and keeps the reply it replaces as a sibling
 * (docs/THREADS.md section 7).
 */
function regenerate(view) {
	const user = view.user;
	const messages = [...thread.views.slice(0, -1).flatMap((v) => v.messages()), { id: user.id, role: "user", content: user.content }];
	view.root.remove();
	thread.views.pop();
	views.delete(view.runId);
	const runId = randomId("run");
	addView(new TurnView({ runId, user }));
	saveThread();
	conversation.start({ threadId: thread.threadId, runId, messages, tools: [], context: [], forwardedProps: { demo: demoOptions() } });
	refreshComposer();
	scrollToEnd();
}

log.addEventListener("regenerate", (event) => {
	if (!runningView()) regenerate(event.detail.view);
});

// ‹ i / n ›: the branch chosen becomes the thread's for every device, and is shown.
log.addEventListener("branch", async (event) => {
	if (runningView()) return;
	const threadId = thread.threadId;
	const response = await fetch(`api/threads/${encodeURIComponent(threadId)}/branch`, {
		method: "POST",
		headers: { "Content-Type": "application/json", Accept: "application/json" },
		body: JSON.stringify({ messageId: event.detail.messageId }),
	}).catch(() => undefined);
	if (response?.ok && thread.threadId === threadId) showThread(threadId);
});

log.addEventListener("approval", (event) => {
	const { view, approved } = event.detail;
	if (runningView()) return; // one turn at a time: the question stays open until it ends
	view.answered(approved);
	answerApproval(view, approved);
});

form.addEventListener("submit", (event) => {
	event.preventDefault();
	const text = prompt.value.trim();
	if (text === "") return;
	prompt.value = "";
	send(text);
	prompt.focus();
});

prompt.addEventListener("keydown", (event) => {
	if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
		event.preventDefault();
		form.requestSubmit();
	} else if (event.key === "Escape" && runningView()) {
		event.preventDefault();
		stop();
	}
});
prompt.addEventListener("input", refreshComposer);

function stop() {
	const view = runningView();
	if (!view) return;
	view.stopping();
	conversation.stop(view.runId);
}

stopButton.addEventListener("click", () => {
	stop();
	prompt.focus();
});

/** clearThread forgets the turns shown (their runs go on on the server). */
function clearThread() {
	for (const view of thread.views) view.root.remove();
	thread.views = [];
	views.clear();
	empty.hidden = false;
}

newThread.addEventListener("click", () => {
	for (const view of thread.views) if (view.running) conversation.stop(view.runId);
	clearThread();
	setThread(randomId("thread"));
	saveThread();
	refreshComposer();
	refreshThreads();
	prompt.focus();
});

/** setThread makes threadId the page's thread: in the address, and followed. */
function setThread(threadId) {
	thread.threadId = threadId;
	window.history.replaceState(null, "", `#thread=${encodeURIComponent(threadId)}`);
	conversation.follow(threadId);
}

/** threadInAddress returns the thread named by the address (#thread=<id>), or "". */
function threadInAddress() {
	return new URLSearchParams(location.hash.slice(1)).get("thread") ?? "";
}

// ---- threads kept by the server ----

/** showing counts the calls of showThread: only the newest shows its answer. */
let showing = 0;

/** showThread shows threadId as the server keeps it, and rejoins its running turn. */
async function showThread(threadId) {
	const shown = ++showing;
	const again = thread.threadId === threadId; // shown anew: what is shown stays if the hydrate fails
	if (!again) clearThread();
	thread.threadId = threadId;
	let hydrated;
	try {
		hydrated = await hydrate(threadId);
	} catch {
		if (again) return;
		hydrated = { turns: [] };
	}
	if (thread.threadId !== threadId || shown !== showing) return; // another thread, or a newer showing, meanwhile
	clearThread(); // the thread shown until now is replaced at once: no empty page meanwhile
	for (const record of hydrated.turns) addView(TurnView.restore(record));
	if (hydrated.active) {
		const view = new TurnView(hydrated.active);
		addView(view);
		conversation.join(hydrated.active.runId);
	}
	// Followed once its turns are shown: a turn the follow brings again is not shown twice.
	setThread(threadId);
	saveThread();
	refreshComposer();
	refreshThreads();
	scrollToEnd();
}

/** refreshThreads lists the server's threads in the side panel. */
async function refreshThreads() {
	let threads;
	try {
		threads = await listThreads();
	} catch {
		return;
	}
	threadList.replaceChildren(
		...threads.map((t) => {
			const open = document.createElement("button");
			open.type = "button";
			open.className = "thread-open";
			open.textContent = t.title || "(untitled)";
			open.title = `Updated ${new Date(t.updatedAt).toLocaleString()}`;
			if (t.threadId === thread.threadId) open.setAttribute("aria-current", "true");
			open.addEventListener("click", () => showThread(t.threadId));
			const remove = document.createElement("button");
			remove.type = "button";
			remove.className = "ghost thread-delete";
			remove.textContent = "Delete";
			remove.setAttribute("aria-label", `Delete ${t.title || "this chat"}`);
			remove.addEventListener("click", async () => {
				await deleteThread(t.threadId).catch(() => {});
				if (t.threadId === thread.threadId) newThread.click();
				else refreshThreads();
			});
			const item = document.createElement("li");
			item.dataset.threadId = t.threadId;
			item.append(open, remove);
			return item;
		}),
	);
}

// ---- start: restore the thread, rejoin a turn that was running ----

let saved = loadThread();
const addressed = threadInAddress();
const fromServer = addressed !== "" && addressed !== saved?.threadId;
if (fromServer) saved = { threadId: addressed, turns: [] };
const savedId = typeof saved?.threadId === "string" && saved.threadId !== "" ? saved.threadId : randomId("thread");
for (const record of Array.isArray(saved?.turns) ? saved.turns : []) {
	if (typeof record?.runId !== "string" || (record.user !== null && typeof record?.user?.content !== "string")) continue;
	if (record.status === Status.running) {
		// Rendered again from the start of its log: nothing of the earlier page is kept.
		const view = new TurnView(record);
		addView(view);
		view.note("Rejoined after a reload");
		conversation.join(record.runId);
	} else {
		addView(TurnView.restore(record));
	}
}
if (fromServer) {
	// A thread this tab has not shown (another tab's address): as the server keeps it.
	showThread(addressed);
} else {
	setThread(savedId);
	saveThread();
	refreshThreads();
}
refreshComposer();
scrollToEnd();
prompt.focus();
