// Package web serves the browser chat page of the gateway.
//
// The page (static/: HTML, CSS and ES modules, no build step) is embedded in the binary and
// served by [Handler] at the root of the gateway's HTTP server. It speaks the gateway's
// WebSocket protocol directly (PROTOCOL.md sections 2 and 3), as @tanstack/ai-client's
// webSocket() adapter does:
//
//   - conversation.js: one conversation socket (ws, no offset) per conversation; each turn is
//     a RunAgentInput run frame (threadId stable, a fresh runId, the thread's messages, tools
//     and context empty, forwardedProps.demo from the options panel). Envelopes {id, chunk}
//     carry the offsets; a turn remembers the offsets it has seen and drops duplicates; pings
//     are ignored; a bare event is the RUN_ERROR of the frame just sent. When a socket drops
//     (or closes 1012, 1011, …), each unfinished turn resumes on ws?runId=…&offset=<last
//     offset seen> with backoff, and the page shows the connection state (connecting,
//     connected, reconnecting, resumed, idle). A resume closed 1000 is the end of the turn;
//     4404 and 1008 are shown as the turn's error. Stop sends {"type":"abort","runId":…}
//     and, since the gateway sends nothing more of an aborted turn live, reads the turn's end
//     (RUN_ERROR aborted) from its log.
//   - render.js: the AG-UI events of a turn (text messages, reasoning in a collapsed
//     section, tool calls with arguments and result, RUN_ERROR with message and code, a
//     RUN_FINISHED interrupt outcome asking for approval as Approve and Deny buttons), and
//     the messages of the turn for the next turn's history. The answer to an approval is a
//     continuation run frame (a fresh runId, parentRunId the paused run, resume resolving
//     each interrupt with payload.approved), shown as a turn of its own.
//   - threads.js: the side panel's thread list, and a thread's turns as the server keeps
//     them (hydrate), with its pending approval; a thread named by the address that the tab
//     has not shown yet is shown that way.
//   - app.js: composer (Enter sends, Shift+Enter adds a line, Escape stops), options panel,
//     light and dark themes (prefers-color-scheme, and a toggle kept in localStorage), and
//     sessionStorage: the thread and every turn shown, a running turn marked as such; after
//     a reload such a turn is rejoined from the start of its log (offset -1) and rendered
//     from scratch, so it is shown once, to its end.
//
// One turn runs at a time per page. An abort only stops a turn started on the same socket
// (PROTOCOL.md section 2): Stop on a turn that is being followed on a resume socket after a
// drop stops following it after a grace period, and says so, while the agent may go on.
//
// The handler only reads the embedded files: it is safe for concurrent use and holds no
// state. [Listen] opens the gateway's listener on a port browsers will load the page from
// ([RefusedPort]).
package web

import (
	"embed"
	"io/fs"
	"net"
	"net/http"
	"slices"
)

//go:embed static
var static embed.FS

// contentSecurityPolicy lets the page load only its own files and open WebSockets to its
// own origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// files returns the page's files (index.html at the root).
func files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic("web: embedded page missing: " + err.Error())
	}
	return sub
}

// Handler returns the handler that serves the chat page at / and its assets beside it. It
// answers GET and HEAD only; unknown paths get 404. Responses are revalidated on every load
// (Cache-Control: no-cache) so a new binary's page is never mixed with an old one's modules.
func Handler() http.Handler {
	page := http.FileServerFS(files())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		page.ServeHTTP(w, r)
	})
}

// refusedPorts is the Fetch standard's list of bad ports: browsers will not load a page from
// one (Chromium says net::ERR_UNSAFE_PORT) and fetch, which the npm clients use, refuses them.
var refusedPorts = []int{0, 1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69,
	77, 79, 87, 95, 101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137, 139,
	143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532, 540, 548, 554, 556,
	563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061,
	6000, 6566, 6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080}

// RefusedPort reports whether browsers and fetch refuse to connect to port.
func RefusedPort(port int) bool { return slices.Contains(refusedPorts, port) }

// Listen listens on the TCP address addr. Where addr leaves the port to the system (port 0),
// it draws again while the port drawn is one browsers and fetch refuse, which a system whose
// ephemeral range starts at 1024 hands out now and then; a port named in addr is kept as it is.
func Listen(addr string) (net.Listener, error) {
	return listen(addr, net.Listen)
}

// listen is Listen over the listen function netListen.
func listen(addr string, netListen func(network, addr string) (net.Listener, error)) (net.Listener, error) {
	_, port, err := net.SplitHostPort(addr)
	anyPort := err == nil && (port == "" || port == "0")
	var refused []net.Listener // held open until a good port is drawn, so none is drawn twice
	defer func() {
		for _, ln := range refused {
			ln.Close()
		}
	}()
	for {
		ln, err := netListen("tcp", addr)
		if err != nil {
			return nil, err
		}
		a, ok := ln.Addr().(*net.TCPAddr)
		if !anyPort || !ok || !RefusedPort(a.Port) {
			return ln, nil
		}
		refused = append(refused, ln)
	}
}
