// The gateway's WebSocket protocol, client side (PROTOCOL.md sections 2 and 3).
//
// A Conversation owns one conversation socket (GET ws, no offset) for many turns, keyed by
// runId, and one resume socket (ws?runId=…&offset=…) per turn that lost its live delivery.
// It follows one thread (follow frame, sent again on every new socket): the runs of the thread
// started elsewhere arrive on the socket as envelopes naming their runId.
// Every delivered event carries the offset the gateway minted for it; a turn remembers the
// offsets it has seen, drops duplicates, and resumes strictly after the last one.
//
// Callbacks (all optional):
//   onEvent(runId, event)   one AG-UI event of a turn, in log order, never twice
//   onDone(runId)           the turn's log was replayed to its close (resume socket, 1000)
//   onFail(runId, message, code)  the turn cannot be followed any more (unknown run, …)
//   onDrop(runId)           the turn's live delivery was lost; it will be resumed
//   onResume(runId, offset) a resume socket for the turn opened (offset "-1": from the start)
//   onFollow(runId)         a run of the followed thread started elsewhere arrives; return
//                           true to be delivered its events (onEvent), false to ignore it
//   onState(state)          connection state: connecting, connected, reconnecting, resumed,
//                           offline (a socket that follows a thread is never closed idle)

/** Close codes the gateway uses (PROTOCOL.md section 3). */
export const Close = Object.freeze({
	normal: 1000,
	policy: 1008,
	internalError: 1011,
	serviceRestart: 1012,
	unknownRun: 4404,
});

const backoffBaseMs = 250;
const backoffMaxMs = 8000;
// Attempts in a row without a single new event before a turn's resume gives up.
const resumeMaxAttempts = 12;
// How long a Stop sent on a socket waits for the turn to end before it is sent over HTTP too.
const abortGraceMs = 3000;

/** backoff returns the delay before retry number attempt (from 0), with jitter. */
export function backoff(attempt) {
	const ceiling = Math.min(backoffMaxMs, backoffBaseMs * 2 ** Math.min(attempt, 10));
	return ceiling / 2 + Math.random() * (ceiling / 2);
}

/** isTerminal reports whether an AG-UI event ends a run. */
export function isTerminal(event) {
	return event.type === "RUN_FINISHED" || event.type === "RUN_ERROR";
}

/** parseFrame classifies one inbound text frame: ping, envelope or bare event. */
export function parseFrame(text) {
	let value;
	try {
		value = JSON.parse(text);
	} catch {
		return { kind: "invalid" };
	}
	if (value === null || typeof value !== "object" || Array.isArray(value)) return { kind: "invalid" };
	if (value.type === "ping") return { kind: "ping" };
	// The envelope never has a top-level type; a bare event always has one.
	if (!("type" in value) && typeof value.id === "string" && value.chunk && typeof value.chunk === "object") {
		return { kind: "envelope", offset: value.id, event: value.chunk, runId: typeof value.runId === "string" ? value.runId : undefined };
	}
	if (typeof value.type === "string") return { kind: "bare", event: value };
	return { kind: "invalid" };
}

export class Conversation {
	/**
	 * @param {{url?: string|URL, onEvent?: Function, onDone?: Function, onFail?: Function, onState?: Function}} options
	 */
	constructor(options = {}) {
		this.url = new URL(options.url ?? "ws", document.baseURI);
		if (this.url.protocol === "http:") this.url.protocol = "ws:";
		if (this.url.protocol === "https:") this.url.protocol = "wss:";
		this.onEvent = options.onEvent ?? (() => {});
		this.onDone = options.onDone ?? (() => {});
		this.onFail = options.onFail ?? (() => {});
		this.onState = options.onState ?? (() => {});
		this.onDrop = options.onDrop ?? (() => {});
		this.onResume = options.onResume ?? (() => {});
		this.onFollow = options.onFollow ?? (() => false);
		this.onBranch = options.onBranch ?? (() => {});
		/** The thread followed on every conversation socket. */
		this.threadId = undefined;
		this.abortUrl = (runId) => new URL(`api/runs/${encodeURIComponent(runId)}/abort`, document.baseURI);

		/** @type {Map<string, Turn>} */
		this.turns = new Map();
		/** Item ids (messages, tool calls) to the run that opened them, to route live events. */
		this.owners = new Map();
		/** The turn most recently started on the conversation socket. */
		this.live = undefined;

		this.socket = undefined;
		this.socketState = "offline";
		this.socketAttempts = 0;
		this.socketTimer = undefined;
		this.queue = [];
		this.resumed = false;
		this.closed = false;
		this.state = "";

		this.onOnline = () => this.retryNow();
		window.addEventListener("online", this.onOnline);
	}

	/** connect opens the conversation socket if it is not open or opening. */
	connect() {
		if (this.closed || this.socket) return;
		clearTimeout(this.socketTimer);
		this.socketTimer = undefined;
		const ws = new WebSocket(this.url);
		this.socket = ws;
		this.socketState = this.socketAttempts > 0 ? "reconnecting" : "connecting";
		this.publishState();
		ws.onopen = () => {
			if (ws !== this.socket) return;
			this.socketAttempts = 0;
			this.socketState = "connected";
			if (this.threadId !== undefined) ws.send(JSON.stringify({ type: "follow", threadId: this.threadId }));
			for (const { frame, turn } of this.queue.splice(0)) {
				ws.send(frame);
				if (turn) turn.sent = true;
			}
			this.publishState();
		};
		ws.onmessage = (message) => {
			if (ws !== this.socket) return;
			this.receiveLive(String(message.data));
		};
		ws.onclose = (close) => {
			if (ws !== this.socket) return;
			this.socket = undefined;
			this.socketClosed(close.code);
		};
	}

	/** start sends a run frame (a RunAgentInput) on the conversation socket. */
	start(input) {
		for (const old of this.turns.values()) {
			if (old.via === "live" && old.terminal) this.forget(old);
		}
		const turn = this.track(input.runId, "live");
		this.live = turn;
		this.resumed = false;
		turn.sent = this.sendFrame(JSON.stringify(input), { turn });
		this.publishState();
		return turn;
	}

	/** follow follows threadId (and no other thread) on this and every later socket. */
	follow(threadId) {
		if (threadId === this.threadId) return;
		const open = this.socket && this.socket.readyState === WebSocket.OPEN;
		if (open && this.threadId !== undefined) this.socket.send(JSON.stringify({ type: "unfollow", threadId: this.threadId }));
		this.threadId = threadId;
		if (open) this.socket.send(JSON.stringify({ type: "follow", threadId }));
		else this.connect();
	}

	/** join follows a run from the start of its log (after a reload), on a resume socket. */
	join(runId) {
		const turn = this.track(runId, "resume");
		this.resume(turn);
		return turn;
	}

	/**
	 * stop asks the gateway to abort a turn, whoever started it: the abort frame goes on the
	 * conversation socket, else on the turn's resume socket, else (and if the turn has not
	 * ended after a grace period) over HTTP, until the turn ends. The gateway delivers
	 * nothing more of an aborted turn live on the socket that sent the abort, so the end of a
	 * turn of this socket (RUN_ERROR aborted) is read from its log on a resume socket after
	 * the last offset seen; a followed or resumed turn gets its end where it is delivered.
	 */
	stop(runId) {
		const turn = this.turns.get(runId);
		if (!turn || turn.finished) return;
		turn.stopping = true;
		const frame = JSON.stringify({ type: "abort", runId });
		let sent = this.sendFrame(frame, { queue: false });
		if (!sent && turn.resumeSocket?.readyState === WebSocket.OPEN) {
			turn.resumeSocket.send(frame);
			sent = true;
		}
		if (turn.via === "live") {
			turn.via = "resume";
			turn.quiet = true;
			this.resume(turn);
		}
		clearTimeout(turn.stopTimer);
		if (sent) turn.stopTimer = setTimeout(() => this.abortOverHTTP(turn), abortGraceMs);
		else this.abortOverHTTP(turn);
	}

	/** abortOverHTTP sends POST api/runs/{runId}/abort, again after failures, until the turn ends. */
	async abortOverHTTP(turn) {
		turn.stopTimer = undefined;
		if (turn.finished || turn.terminal || this.closed) return;
		let status = 0;
		try {
			status = (await fetch(this.abortUrl(turn.runId), { method: "POST" })).status;
		} catch {
			// Offline: tried again below.
		}
		if (turn.finished || turn.terminal) return;
		if (status === 404) {
			this.forget(turn);
			this.onFail(turn.runId, "unknown or expired run", "unknown_run");
			return;
		}
		// 200: the run's log is closed, its end is on its way; otherwise try again.
		if (status !== 200) turn.stopTimer = setTimeout(() => this.abortOverHTTP(turn), backoff(turn.stopAttempts++));
	}

	/** close closes every socket and stops every timer. */
	close() {
		this.closed = true;
		window.removeEventListener("online", this.onOnline);
		clearTimeout(this.socketTimer);
		this.socket?.close(Close.normal);
		this.socket = undefined;
		for (const turn of this.turns.values()) this.forget(turn);
	}

	/** connectionState is the state shown to the user. */
	connectionState() {
		for (const turn of this.turns.values()) {
			if (!turn.finished && !turn.quiet && (turn.resumeTimer || turn.resumeConnecting)) return "reconnecting";
		}
		if (this.resumed) return "resumed";
		return this.socketState;
	}

	// ---- internals ----

	track(runId, via) {
		let turn = this.turns.get(runId);
		if (!turn) {
			turn = new Turn(runId);
			this.turns.set(runId, turn);
		}
		turn.via = via;
		return turn;
	}

	forget(turn) {
		turn.finished = true;
		clearTimeout(turn.resumeTimer);
		clearTimeout(turn.stopTimer);
		turn.resumeTimer = undefined;
		const ws = turn.resumeSocket;
		turn.resumeSocket = undefined;
		turn.resumeConnecting = false;
		if (ws && ws.readyState <= WebSocket.OPEN) ws.close(Close.normal);
		if (this.live === turn) this.live = undefined;
		this.turns.delete(turn.runId);
		for (const [item, runId] of this.owners) {
			if (runId === turn.runId) this.owners.delete(item);
		}
		this.publishState();
	}

	sendFrame(frame, { queue = true, turn } = {}) {
		if (this.socket && this.socket.readyState === WebSocket.OPEN) {
			this.socket.send(frame);
			return true;
		}
		if (!queue) return false;
		this.queue.push({ frame, turn });
		this.connect();
		return false;
	}

	receiveLive(text) {
		const frame = parseFrame(text);
		if (frame.kind === "ping" || frame.kind === "invalid") return;
		if (frame.kind === "bare" && frame.event.type === "CUSTOM" && frame.event.name === "thread.branch") {
			// A followed thread's active branch switched (docs/THREADS.md section 7).
			this.onBranch(frame.event.value ?? {});
			return;
		}
		if (frame.kind === "bare") {
			// Only a RUN_ERROR that could not be stored: it belongs to the frame just sent.
			const turn = this.live;
			if (turn && !turn.finished) {
				this.deliver(turn, frame.event, undefined);
				this.forget(turn);
				this.onDone(turn.runId);
			}
			return;
		}
		if (frame.runId !== undefined) {
			// A run of the followed thread, or the end of a turn of this socket that was
			// stopped elsewhere.
			let turn = this.turns.get(frame.runId);
			if (!turn) {
				if (!this.onFollow(frame.runId)) return;
				turn = this.track(frame.runId, "follow");
			}
			if (turn.finished || (turn.via !== "live" && turn.via !== "follow")) return;
			this.deliver(turn, frame.event, frame.offset);
			if (turn.via === "follow" && turn.terminal) {
				this.forget(turn);
				this.onDone(turn.runId);
			}
			return;
		}
		const turn = this.route(frame);
		if (!turn || turn.finished || turn.via !== "live") return;
		this.deliver(turn, frame.event, frame.offset);
	}

	/** route finds the turn a live envelope belongs to (envelopes name no run). */
	route(frame) {
		if (frame.runId !== undefined) return this.turns.get(frame.runId);
		const event = frame.event;
		if (typeof event.runId === "string" && event.type.startsWith("RUN_") && this.turns.has(event.runId)) {
			return this.turns.get(event.runId);
		}
		for (const key of ["messageId", "toolCallId", "parentMessageId"]) {
			const owner = typeof event[key] === "string" ? this.owners.get(event[key]) : undefined;
			if (owner !== undefined && this.turns.has(owner)) return this.turns.get(owner);
		}
		return this.live;
	}

	deliver(turn, event, offset) {
		if (offset !== undefined) {
			if (turn.seen.has(offset)) return;
			turn.seen.add(offset);
			turn.last = offset;
		}
		turn.attempts = 0;
		if (event.type?.endsWith("_START") && !event.type.startsWith("RUN_")) {
			for (const key of ["messageId", "toolCallId"]) {
				if (typeof event[key] === "string" && !this.owners.has(event[key])) this.owners.set(event[key], turn.runId);
			}
		}
		if (event.type === "RUN_STARTED") turn.terminal = false;
		if (isTerminal(event)) turn.terminal = true;
		this.onEvent(turn.runId, event);
	}

	socketClosed(code) {
		// Turns that were delivered live on the socket continue in the log: resume each one.
		// A run frame still queued is sent on the next socket instead.
		for (const turn of this.turns.values()) {
			if (turn.via === "live" && !turn.sent) continue;
			const onSocket = turn.via === "live" || turn.via === "follow";
			if (onSocket && !turn.finished && !turn.terminal) {
				turn.via = "resume";
				this.onDrop(turn.runId);
				this.scheduleResume(turn);
			} else if (onSocket && turn.terminal) {
				this.forget(turn);
			}
		}
		if (this.closed) return;
		this.socketState = "reconnecting";
		this.publishState();
		const delay = backoff(this.socketAttempts++);
		this.socketTimer = setTimeout(() => this.connect(), delay);
	}

	scheduleResume(turn) {
		if (turn.finished || turn.resumeSocket || turn.resumeTimer) return;
		if (turn.attempts >= resumeMaxAttempts) {
			this.forget(turn);
			this.onFail(turn.runId, "could not reconnect to the gateway", "unreachable");
			return;
		}
		const delay = backoff(turn.attempts++);
		turn.resumeTimer = setTimeout(() => {
			turn.resumeTimer = undefined;
			this.resume(turn);
		}, delay);
		this.publishState();
	}

	resume(turn) {
		if (this.closed || turn.finished || turn.resumeSocket) return;
		turn.via = "resume";
		const url = new URL(this.url);
		const offset = turn.last ?? "-1";
		url.searchParams.set("runId", turn.runId);
		url.searchParams.set("offset", offset);
		const ws = new WebSocket(url);
		turn.resumeSocket = ws;
		turn.resumeConnecting = true;
		this.publishState();
		ws.onopen = () => {
			if (ws !== turn.resumeSocket) return;
			turn.resumeConnecting = false;
			if (turn.quiet) return;
			this.resumed = true;
			this.publishState();
			this.onResume(turn.runId, offset);
		};
		ws.onmessage = (message) => {
			if (ws !== turn.resumeSocket) return;
			const frame = parseFrame(String(message.data));
			if (frame.kind === "envelope") this.deliver(turn, frame.event, frame.offset);
			else if (frame.kind === "bare") this.deliver(turn, frame.event, undefined);
		};
		ws.onclose = (close) => {
			if (ws !== turn.resumeSocket) return;
			turn.resumeSocket = undefined;
			turn.resumeConnecting = false;
			if (close.code === Close.normal) {
				// The log was replayed up to its close: the turn is over.
				this.forget(turn);
				this.onDone(turn.runId);
				return;
			}
			if (close.code === Close.unknownRun || close.code === Close.policy) {
				this.forget(turn);
				this.onFail(turn.runId, close.reason || `resume refused (${close.code})`, close.code === Close.unknownRun ? "unknown_run" : "invalid_resume");
				return;
			}
			// 1012 (service restart), 1011, a dropped connection: try again after the last offset.
			this.scheduleResume(turn);
		};
	}

	retryNow() {
		if (this.closed) return;
		if (!this.socket && this.socketTimer) this.connect();
		for (const turn of this.turns.values()) {
			if (turn.resumeTimer) {
				clearTimeout(turn.resumeTimer);
				turn.resumeTimer = undefined;
				this.resume(turn);
			}
		}
	}

	publishState() {
		const state = this.connectionState();
		if (state === this.state) return;
		this.state = state;
		this.onState(state);
	}
}

/** Turn is the client's record of one run: where it is delivered from and what it has seen. */
class Turn {
	constructor(runId) {
		this.runId = runId;
		/**
		 * "live" (its run frame went on the conversation socket), "follow" (a run of the
		 * followed thread, delivered on the conversation socket) or "resume" (its own resume
		 * socket).
		 */
		this.via = "live";
		this.seen = new Set();
		this.last = undefined;
		this.terminal = false;
		this.finished = false;
		/** Its run frame was handed to a socket (not only queued). */
		this.sent = false;
		this.stopping = false;
		/** Its end is being read from the log after a stop: not a reconnect to show. */
		this.quiet = false;
		this.attempts = 0;
		this.resumeSocket = undefined;
		this.resumeConnecting = false;
		this.resumeTimer = undefined;
		this.stopTimer = undefined;
		this.stopAttempts = 0;
	}
}
