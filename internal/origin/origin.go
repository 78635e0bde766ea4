// Package origin holds the gateway's one rule for the browser origins it serves: the
// WebSocket handshake, the HTTP transports and the cookie-authenticated Durable Streams
// requests all apply it.
package origin

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Allowed applies the socket's origin rule to a browser's request (one with an Origin
// header): the request's own host, or a match of patterns (path.Match on the origin's host,
// or on scheme://host for a pattern with a scheme). A request without an Origin header is
// allowed. It repeats coder/websocket's rule (websocket.AcceptOptions.OriginPatterns)
// because the library checks origins only inside Accept, for upgrade requests, and does not
// export the check.
func Allowed(r *http.Request, patterns []string) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return true
		}
	}
	return false
}
