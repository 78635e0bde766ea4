package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// identityProvider publishes a JWK Set over HTTPS on loopback, as an identity provider's
// jwks_uri does; the test rotates its keys and takes it down, and counts the fetches.
type identityProvider struct {
	*httptest.Server
	caFile  string // PEM of its certificate, for --jwt-jwks-ca
	fetches atomic.Int64
	mu      sync.Mutex
	keys    map[string]*ecdsa.PrivateKey // published, by kid
	down    bool
}

func startIdentityProvider(tb testing.TB) *identityProvider {
	tb.Helper()
	p := &identityProvider{keys: map[string]*ecdsa.PrivateKey{}}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(p.serveJWKS))
	p.Config.ErrorLog = log.New(io.Discard, "", 0)
	p.StartTLS()
	tb.Cleanup(p.Close)
	p.caFile = filepath.Join(tb.TempDir(), "idp-ca.pem")
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Certificate().Raw}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p *identityProvider) serveJWKS(w http.ResponseWriter, r *http.Request) {
	p.fetches.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
		return
	}
	b64 := base64.RawURLEncoding.EncodeToString
	keys := []any{}
	for kid, k := range p.keys {
		pub, _ := k.PublicKey.Bytes()
		keys = append(keys, map[string]any{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256", "x": b64(pub[1:33]), "y": b64(pub[33:])})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"keys": keys})
}

// publish adds a new key under kid and returns it.
func (p *identityProvider) publish(tb testing.TB, kid string) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	p.mu.Lock()
	p.keys[kid] = k
	p.mu.Unlock()
	return k
}

func (p *identityProvider) retire(kid string) {
	p.mu.Lock()
	delete(p.keys, kid)
	p.mu.Unlock()
}

func (p *identityProvider) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

// token signs a token of sub with the key kid, expiring at exp.
func (p *identityProvider) token(tb testing.TB, kid, sub string, exp time.Time) string {
	tb.Helper()
	p.mu.Lock()
	k := p.keys[kid]
	p.mu.Unlock()
	if k == nil {
		tb.Fatalf("no key %s", kid)
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": sub, "aud": "wsgateway", "exp": exp.Unix()})
	t.Header["kid"] = kid
	s, err := t.SignedString(k)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// dialBearer opens a socket to url with a bearer token; it returns the handshake status when
// refused.
func dialBearer(ctx context.Context, url, tok string) (*websocket.Conn, int, error) {
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, status, err
	}
	c.SetReadLimit(1 << 20)
	return c, 101, nil
}

// readBare reads c until a bare event (not an envelope, not a ping) and returns it.
func readBare(ctx context.Context, c *websocket.Conn) (map[string]any, error) {
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		var f map[string]any
		if json.Unmarshal(data, &f) != nil {
			return nil, fmt.Errorf("frame is not JSON: %s", data)
		}
		if f["type"] != nil && f["type"] != "ping" {
			return f, nil
		}
	}
}

// TestTokensFromIdentityProvider runs a gateway process whose tokens come from an HTTPS
// identity provider (--jwt-jwks-url, its CA in --jwt-jwks-ca) that rotates its keys, with
// tokens of a few seconds:
//   - a conversation socket whose 3 s token expires is closed 4401 "token expired" within a
//     second of exp, while its turn goes on into the log;
//   - a token of a key published after the gateway started resumes that turn (no restart),
//     and the client assembles the complete turn, nothing twice;
//   - an auth frame with a fresh token keeps a socket past its first token's exp; one of
//     another subject is refused forbidden;
//   - a retired key's tokens are refused after the next scheduled fetch; during an outage of
//     the provider the last set keeps verifying.
func TestTokensFromIdentityProvider(t *testing.T) {
	idp := startIdentityProvider(t)
	idp.publish(t, "k1")
	gw := startGateway(t, "--auth", "jwt", "--jwt-jwks-url", idp.URL+"/jwks", "--jwt-jwks-ca", idp.caFile,
		"--jwt-jwks-refresh", "1s", "--jwt-audience", "wsgateway")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// A socket with a 3 s token starts a turn of about 6 s.
	exp := time.Now().Add(3 * time.Second).Truncate(time.Second)
	c, status, err := dialBearer(ctx, gw.WS, idp.token(t, "k1", "alice", exp))
	if err != nil {
		t.Fatalf("dial with a k1 token: %d %v", status, err)
	}
	defer c.CloseNow()
	const tokens = 30
	if err := c.Write(ctx, websocket.MessageText, demoRunFrame("short-token", fmt.Sprintf(`{"tokens":%d,"intervalMs":200}`, tokens))); err != nil {
		t.Fatal(err)
	}
	got, code, err := readFrames(ctx, c, nil)
	closedAt := time.Now()
	var ce websocket.CloseError
	if code != 4401 || !errors.As(err, &ce) || ce.Reason != "token expired" {
		t.Fatalf("socket ended with %v, want close 4401 \"token expired\"", err)
	}
	if closedAt.Before(exp) || closedAt.After(exp.Add(1500*time.Millisecond)) {
		t.Errorf("closed %v after exp, want within a second", closedAt.Sub(exp))
	}
	t.Logf("closed 4401 %v after exp, with %d events received", closedAt.Sub(exp).Round(time.Millisecond), len(got))
	if len(got) == 0 || turnEnded(got) {
		t.Fatalf("received %d events before the close, want a turn under way", len(got))
	}

	// The provider rotates: k2 is published, and a k2 token (unknown to the gateway until
	// now) resumes the turn after the last offset received.
	fetches := idp.fetches.Load()
	idp.publish(t, "k2")
	r, status, err := dialBearer(ctx, resumeURL(gw, "short-token", got[len(got)-1].ID), idp.token(t, "k2", "alice", time.Now().Add(time.Hour)))
	if err != nil {
		t.Fatalf("resume with a token of the new key k2: %d %v", status, err)
	}
	t.Logf("a token of the new key k2 accepted after %d fetch(es) of the JWK Set", idp.fetches.Load()-fetches)
	rest, code, _ := readFrames(ctx, r, nil)
	if code != websocket.StatusNormalClosure {
		t.Fatalf("resume closed %v, want 1000", code)
	}
	all := append(got, rest...)
	if end := checkSequence(t, "received then resumed", all, tokens); end != "" {
		t.Errorf("the turn ended %s, want complete", end)
	}

	// An auth frame before exp keeps the socket; another subject's token is refused.
	exp = time.Now().Add(3 * time.Second).Truncate(time.Second)
	c2, status, err := dialBearer(ctx, gw.WS, idp.token(t, "k2", "alice", exp))
	if err != nil {
		t.Fatalf("dial with a k2 token: %d %v", status, err)
	}
	defer c2.CloseNow()
	auth := func(tok string) map[string]any {
		t.Helper()
		if err := c2.Write(ctx, websocket.MessageText, []byte(`{"type":"auth","token":"`+tok+`"}`)); err != nil {
			t.Fatal(err)
		}
		f, err := readBare(ctx, c2)
		if err != nil {
			t.Fatalf("no answer to the auth frame: %v", err)
		}
		return f
	}
	if f := auth(idp.token(t, "k2", "mallory", time.Now().Add(time.Hour))); f["type"] != "RUN_ERROR" || f["code"] != "forbidden" {
		t.Errorf("answer to another subject's token: %v, want RUN_ERROR forbidden", f)
	}
	fresh := time.Now().Add(time.Hour).Truncate(time.Second)
	if f := auth(idp.token(t, "k2", "alice", fresh)); f["type"] != "CUSTOM" || f["name"] != "auth.accepted" ||
		f["value"].(map[string]any)["exp"] != float64(fresh.Unix()) {
		t.Errorf("answer to a fresh token: %v, want CUSTOM auth.accepted with exp %d", f, fresh.Unix())
	}
	time.Sleep(time.Until(exp.Add(1500 * time.Millisecond)))
	if err := c2.Write(ctx, websocket.MessageText, demoRunFrame("after-auth", `{"tokens":2,"intervalMs":0}`)); err != nil {
		t.Fatalf("socket closed past its first token's exp: %v", err)
	}
	if es, code, err := readFrames(ctx, c2, turnEnded); err != nil || checkSequence(t, "turn after the auth frame", es, 2) != "" {
		t.Fatalf("turn past the first token's exp: %v %v", code, err)
	}

	// k1 is retired: after the next scheduled fetch its tokens are refused.
	k1 := idp.token(t, "k1", "alice", time.Now().Add(time.Hour))
	idp.retire("k1")
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, status, _ := dialBearer(ctx, gw.WS, k1)
		if c != nil {
			c.CloseNow()
		}
		if status == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a token of the retired key still opens a socket (%d) 5 s after its retirement", status)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// An outage: the fetches fail, the last set (k2) still verifies.
	idp.setDown(true)
	before := idp.fetches.Load()
	for idp.fetches.Load() < before+2 {
		if ctx.Err() != nil {
			t.Fatal("no scheduled fetch during the outage")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c3, status, err := dialBearer(ctx, gw.WS, idp.token(t, "k2", "alice", time.Now().Add(time.Hour)))
	if err != nil {
		t.Fatalf("dial with a k2 token during the provider's outage: %d %v, want the last set kept", status, err)
	}
	c3.CloseNow()
	idp.setDown(false)
	t.Logf("JWK Set fetched %d times in all", idp.fetches.Load())
}
