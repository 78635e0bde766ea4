package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key into dir and returns
// their paths and a pool trusting the certificate.
func writeCert(tb testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// addrHandler is a slog handler that sends the address of the "listening" record.
type addrHandler struct{ addr chan string }

func (h addrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h addrHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h addrHandler) WithGroup(string) slog.Handler            { return h }
func (h addrHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "listening" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == keyAddr {
			h.addr <- a.Value.String()
		}
		return true
	})
	return nil
}

// TestServeTLSWithJWT runs the gateway in-process with --tls-cert/--tls-key and --auth jwt
// (HS256 secret from the environment): a WSS client with a token runs a turn; one without is
// refused 401; plain HTTP on the TLS port is refused.
func TestServeTLSWithJWT(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	secret := "a secret of more than thirty-two bytes, for tests"
	t.Setenv("WSGATEWAY_TEST_JWT_SECRET", secret)
	cfg, err := parseServe([]string{"--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--tls-cert", certFile, "--tls-key", keyFile,
		"--auth", "jwt", "--jwt-secret-env", "WSGATEWAY_TEST_JWT_SECRET", "--jwt-audience", "wsgateway",
		"--drain-timeout", "1s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, cfg, slog.New(addrHandler{addrc})) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-served:
		t.Fatalf("serve returned %v before listening", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no listening line within 60s")
	}

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer tcancel()

	resp, err := client.Get("https://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET https /readyz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET https /readyz = %d, want 200", resp.StatusCode)
	}

	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	if resp, err := plain.Get("http://" + addr + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain GET on the TLS port = %d, want 400", resp.StatusCode)
		}
	}

	_, resp, err = websocket.Dial(tctx, "wss://"+addr+"/ws", &websocket.DialOptions{HTTPClient: client})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("WSS dial without a token = %v, %v; want 401", resp, err)
	}

	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "aud": "wsgateway", "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := websocket.Dial(tctx, "wss://"+addr+"/ws", &websocket.DialOptions{
		HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatalf("WSS dial with a token: %v", err)
	}
	defer c.CloseNow()
	frame := `{"threadId":"t","runId":"tls-run","messages":[{"id":"u","role":"user","content":"over tls"}],"forwardedProps":{"demo":{"intervalMs":0}}}`
	if err := c.Write(tctx, websocket.MessageText, []byte(frame)); err != nil {
		t.Fatal(err)
	}
	var reply strings.Builder
	for {
		_, data, err := c.Read(tctx)
		if err != nil {
			t.Fatalf("read: %v (reply so far %q)", err, reply.String())
		}
		var env struct {
			Chunk struct {
				Type  string `json:"type"`
				Delta string `json:"delta"`
			} `json:"chunk"`
		}
		if json.Unmarshal(data, &env) != nil {
			continue
		}
		reply.WriteString(env.Chunk.Delta)
		if env.Chunk.Type == "RUN_FINISHED" || env.Chunk.Type == "RUN_ERROR" {
			if env.Chunk.Type != "RUN_FINISHED" || reply.String() != "You said: over tls" {
				t.Errorf("turn over WSS ended %s with reply %q, want RUN_FINISHED and %q", env.Chunk.Type, reply.String(), "You said: over tls")
			}
			break
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func TestNewPrincipalErrors(t *testing.T) {
	dir := t.TempDir()
	priv := filepath.Join(dir, "private.pem")
	if err := os.WriteFile(priv, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwks, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--auth", "jwt", "--jwt-secret-env", "SECRET"}, nil, "the environment variable SECRET is not set"},
		{[]string{"--auth", "jwt", "--jwt-secret-env", "SECRET"}, map[string]string{"SECRET": "short"}, "at least 32 bytes"},
		{[]string{"--auth", "jwt", "--jwt-key-file", filepath.Join(dir, "missing.pem")}, nil, "--jwt-key-file"},
		{[]string{"--auth", "jwt", "--jwt-key-file", priv}, nil, "never a private key"},
		{[]string{"--auth", "jwt", "--jwt-jwks-file", jwks}, nil, "no RSA or EC signature key"},
		{[]string{"--auth", "jwt", "--jwt-jwks-url", "https://127.0.0.1:1/jwks"}, nil, "fetching the JWK Set"},
		{[]string{"--auth", "jwt", "--jwt-jwks-url", "https://127.0.0.1:1/jwks", "--jwt-jwks-ca", jwks}, nil, "--jwt-jwks-ca: no PEM certificate found"},
	}
	log := slog.New(slog.DiscardHandler)
	for _, tt := range tests {
		cfg, err := parseServe(tt.args, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("parseServe(%q): %v", tt.args, err)
		}
		_, _, err = newAuthenticator(cfg, env(tt.env), log)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("newAuthenticator(%q) error = %v, want errUsage containing %q", tt.args, err, tt.want)
		}
	}
	cfg, _ := parseServe(nil, env(nil), io.Discard)
	if a, mode, err := newAuthenticator(cfg, env(nil), log); a != nil || err != nil || !strings.Contains(mode, "off") {
		t.Errorf("newAuthenticator(--auth none) = %v, %q, %v; want nil, a mode saying off", a != nil, mode, err)
	}
	cfg.tlsCert, cfg.tlsKey = filepath.Join(dir, "no-cert.pem"), filepath.Join(dir, "no-key.pem")
	if _, err := newTLSConfig(cfg); !errors.Is(err, errUsage) {
		t.Errorf("newTLSConfig(missing files) = %v, want errUsage", err)
	}
}

// TestNewAuthenticatorJWKSURL: --jwt-jwks-url with the provider's CA in --jwt-jwks-ca verifies
// the provider's tokens; without the CA the gateway refuses to start.
func TestNewAuthenticatorJWKSURL(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := writeCert(t, dir)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	doc, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{
		"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "x": b64(pub[1:33]), "y": b64(pub[33:]),
	}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	idp := &http.Server{
		Handler:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(doc) }),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go idp.ServeTLS(ln, certFile, keyFile)
	defer idp.Close()
	url := "https://" + ln.Addr().String() + "/jwks"

	quiet := slog.New(slog.DiscardHandler)
	cfg, err := parseServe([]string{"--auth", "jwt", "--jwt-jwks-url", url}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := newAuthenticator(cfg, env(nil), quiet); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("newAuthenticator(--jwt-jwks-url without --jwt-jwks-ca) = %v, want errUsage about the certificate", err)
	}
	cfg, err = parseServe([]string{"--auth", "jwt", "--jwt-jwks-url", url, "--jwt-jwks-ca", certFile}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, mode, err := newAuthenticator(cfg, env(nil), quiet)
	if err != nil {
		t.Fatalf("newAuthenticator(--jwt-jwks-url --jwt-jwks-ca): %v", err)
	}
	defer a.Close()
	if !strings.Contains(mode, url) {
		t.Errorf("mode = %q, want it to name %s", mode, url)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest("GET", "/ws", nil)
	r.Header.Set("Authorization", "Bearer "+s)
	if p, _, err := tokensOf(a, quiet, nil).Identify(r); p != "alice" || err != nil {
		t.Errorf("principal of a token of the provider = %q, %v; want alice", p, err)
	}
}
