package e2e

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestDurableAuth: with --auth jwt a Durable Stream belongs to its token's principal, a
// request without a token is refused 401, and a body over --durable-max-body 413.
func TestDurableAuth(t *testing.T) {
	key, pemFile := newJWTKey(t)
	gw := &secGateway{gateway: startGateway(t, "--auth", "jwt", "--jwt-key-file", pemFile,
		"--jwt-audience", secAudience, "--jwt-issuer", secIssuer, "--durable-max-body", "4KiB"), key: key}
	url := gw.URL + "/v1/stream/notes"
	send := func(method, sub, body string) (int, string) {
		t.Helper()
		return durableDo(t, method, url, body, func(req *http.Request) {
			if sub != "" {
				req.Header.Set("Authorization", "Bearer "+gw.token(t, sub, nil))
			}
		})
	}
	for _, tc := range []struct {
		method, sub, body string
		code              int
		want              string
	}{
		{"PUT", "", "", 401, ""},
		{"PUT", "alice", "from alice", 201, ""},
		{"GET", "", "", 401, ""},
		{"GET", "bob", "", 404, ""},
		{"POST", "bob", "from bob", 404, ""},
		{"GET", "alice", "", 200, "from alice"},
		{"POST", "alice", string(bytes.Repeat([]byte("x"), 8<<10)), 413, ""},
		{"PUT", "bob", "bob's own", 201, ""},
		{"GET", "bob", "", 200, "bob's own"},
		{"GET", "alice", "", 200, "from alice"},
	} {
		code, body := send(tc.method, tc.sub, tc.body)
		if code != tc.code || (tc.want != "" && body != tc.want) {
			t.Errorf("%s as %q = %d %q, want %d %q", tc.method, tc.sub, code, body, tc.code, tc.want)
		}
	}
}

// TestDurableCrossSiteCookie: a Durable Streams request that a page of another site makes
// with the user's token cookie (a simple POST needs no preflight) is refused 403 and writes
// nothing; the same request from the gateway's own origin or an --allowed-origins one, or
// from anywhere with an Authorization header, is served.
func TestDurableCrossSiteCookie(t *testing.T) {
	key, pemFile := newJWTKey(t)
	gw := &secGateway{gateway: startGateway(t, "--auth", "jwt", "--jwt-key-file", pemFile,
		"--jwt-audience", secAudience, "--jwt-issuer", secIssuer, "--allowed-origins", "app.example.com"), key: key}
	url := gw.URL + "/v1/stream/notes"
	tok := gw.token(t, "alice", nil)
	send := func(method, origin, body string, cookie bool) (int, string) {
		t.Helper()
		return durableDo(t, method, url, body, func(req *http.Request) {
			if origin != "" {
				req.Header.Set("Origin", origin)
			}
			if cookie {
				req.AddCookie(&http.Cookie{Name: "wsgateway_token", Value: tok})
			} else {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
		})
	}
	if code, _ := send("PUT", "", "a", false); code != 201 {
		t.Fatalf("PUT = %d, want 201", code)
	}
	if code, body := send("POST", "https://evil.example", "-evil", true); code != 403 {
		t.Errorf("cross-site POST with the cookie = %d %q, want 403", code, body)
	}
	if code, body := send("GET", "https://evil.example", "", true); code != 403 {
		t.Errorf("cross-site GET with the cookie = %d %q, want 403", code, body)
	}
	for _, r := range []struct {
		origin, body string
		cookie       bool
	}{
		{gw.URL, "b", true}, // the gateway's own origin
		{"https://app.example.com", "c", true},
		{"https://evil.example", "d", false},
	} {
		if code, body := send("POST", r.origin, r.body, r.cookie); code/100 != 2 {
			t.Errorf("POST from %s (cookie %v) = %d %q, want 2xx", r.origin, r.cookie, code, body)
		}
	}
	if code, body := send("GET", "", "", false); code != 200 || body != "abcd" {
		t.Errorf("the stream = %d %q, want 200 \"abcd\"", code, body)
	}
}

// durableDo sends a text/plain request, set by set, and returns the answer's status and body.
func durableDo(t testing.TB, method, url, body string, set func(*http.Request)) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/plain")
	set(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
