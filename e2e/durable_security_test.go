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
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		if sub != "" {
			req.Header.Set("Authorization", "Bearer "+gw.token(t, sub, nil))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
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
