package auth

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// jwksServer is an identity provider's HTTPS JWK Set endpoint whose keys and availability
// the test changes, counting the fetches.
type jwksServer struct {
	*httptest.Server
	fetches atomic.Int64
	mu      sync.Mutex
	doc     []byte
	down    bool
}

func newJWKSServer(tb testing.TB, doc []byte) *jwksServer {
	tb.Helper()
	s := &jwksServer{doc: doc}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		doc, down := s.doc, s.down
		s.mu.Unlock()
		if down {
			http.Error(w, "provider outage", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(doc)
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted-CA case fails handshakes
	s.StartTLS()
	tb.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(doc []byte) {
	s.mu.Lock()
	s.doc = doc
	s.mu.Unlock()
}

func (s *jwksServer) setDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// roots returns a pool that trusts the server's certificate.
func (s *jwksServer) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

func TestJWKSURLRotation(t *testing.T) {
	rsaKey, _, ecKey, _ := keys(t)
	srv := newJWKSServer(t, jwksOf(t, jwkOf(&rsaKey.PublicKey, "old")))
	a := newAuth(t, Config{JWKSURL: srv.URL, JWKSRootCAs: srv.roots(), JWKSRefresh: 300 * time.Millisecond, JWKSUnknownKID: time.Hour})
	t.Cleanup(a.Close)
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("fetches after New = %d, want 1", n)
	}
	oldTok := sign(t, jwt.SigningMethodRS256, rsaKey, "old", claims("alice"))
	newTok := sign(t, jwt.SigningMethodES256, ecKey, "new", claims("bob"))
	if p, err := a.Verify(oldTok); p != "alice" || err != nil {
		t.Fatalf("Verify(old key) = %q, %v; want alice", p, err)
	}

	// The provider publishes a new key and signs with it: its first token fetches the set.
	srv.serve(jwksOf(t, jwkOf(&rsaKey.PublicKey, "old"), jwkOf(&ecKey.PublicKey, "new")))
	if p, err := a.Verify(newTok); p != "bob" || err != nil {
		t.Fatalf("Verify(new key) after rotation = %q, %v; want bob without a restart", p, err)
	}

	// The provider removes the old key: the next scheduled fetch drops it.
	srv.serve(jwksOf(t, jwkOf(&ecKey.PublicKey, "new")))
	start := time.Now()
	testenv.WaitFor(t, 3*time.Second, "a token of the removed key still verifies", func() bool {
		_, err := a.Verify(oldTok)
		return errors.Is(err, ErrInvalidToken) && strings.Contains(err.Error(), `no key with key id "old" in the JWK Set`)
	})
	t.Logf("removed key refused %v after its removal", time.Since(start).Round(time.Millisecond))
	if p, err := a.Verify(newTok); p != "bob" || err != nil {
		t.Fatalf("Verify(new key) after the removal = %q, %v; want bob", p, err)
	}

	// A set too large to read is refused like a failed fetch: the last good set stays (read
	// whole, this empty set would drop every key).
	srv.serve([]byte(`{"pad":"` + strings.Repeat("x", maxJWKSLen) + `","keys":[]}`))
	before0 := srv.fetches.Load()
	testenv.WaitFor(t, 3*time.Second, "no scheduled fetch of the oversized set", func() bool { return srv.fetches.Load() >= before0+2 })
	if p, err := a.Verify(newTok); p != "bob" || err != nil {
		t.Fatalf("Verify after an oversized set = %q, %v; want bob (the last good set)", p, err)
	}

	// An outage: fetches fail, the last good set stays.
	srv.setDown(true)
	before := srv.fetches.Load()
	testenv.WaitFor(t, 3*time.Second, "no scheduled fetch during the outage", func() bool { return srv.fetches.Load() >= before+2 })
	if p, err := a.Verify(newTok); p != "bob" || err != nil {
		t.Fatalf("Verify during the outage = %q, %v; want bob (the last good set)", p, err)
	}
	if _, err := a.Verify(oldTok); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("Verify(removed key) during the outage = %v, want ErrInvalidToken", err)
	}
	srv.setDown(false)
	t.Logf("fetches: %d", srv.fetches.Load())
}

func TestJWKSURLUnknownKIDRateLimit(t *testing.T) {
	rsaKey, rsaKey2, _, _ := keys(t)
	for _, tt := range []struct {
		name     string
		interval time.Duration
		tokens   int
		spacing  time.Duration
	}{
		{"one per hour", time.Hour, 50, 0},
		{"one per 250ms", 250 * time.Millisecond, 8, 50 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newJWKSServer(t, jwksOf(t, jwkOf(&rsaKey.PublicKey, "r1")))
			a := newAuth(t, Config{JWKSURL: srv.URL, JWKSRootCAs: srv.roots(), JWKSRefresh: time.Hour, JWKSUnknownKID: tt.interval})
			t.Cleanup(a.Close)
			start := time.Now()
			var slowest time.Duration
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range tt.tokens {
				tok := sign(t, jwt.SigningMethodRS256, rsaKey2, fmt.Sprintf("forged-%d", i), claims("mallory"))
				wg.Go(func() {
					t0 := time.Now()
					if _, err := a.Verify(tok); !errors.Is(err, ErrInvalidToken) {
						t.Errorf("Verify(unknown kid %d) = %v, want ErrInvalidToken", i, err)
					}
					mu.Lock()
					slowest = max(slowest, time.Since(t0))
					mu.Unlock()
				})
				time.Sleep(tt.spacing)
			}
			wg.Wait()
			elapsed := time.Since(start)
			// The first fetch is New's; every unknown kid may cause one more, at most one per
			// interval (the limiter starts with one token).
			got := srv.fetches.Load() - 1
			want := 1 + int64(elapsed/tt.interval)
			t.Logf("%d tokens of unknown kids in %v: %d fetches caused (at most %d allowed), slowest refusal %v",
				tt.tokens, elapsed.Round(time.Millisecond), got, want, slowest.Round(time.Millisecond))
			if got < 1 || got > want {
				t.Errorf("fetches caused by %d unknown kids in %v = %d, want 1..%d", tt.tokens, elapsed, got, want)
			}
			if slowest > jwksUnknownKIDWait+time.Second {
				t.Errorf("slowest refusal took %v, want at most the wait bound %v", slowest, jwksUnknownKIDWait)
			}
			if p, err := a.Verify(sign(t, jwt.SigningMethodRS256, rsaKey, "r1", claims("alice"))); p != "alice" || err != nil {
				t.Errorf("Verify(known key) after the flood = %q, %v; want alice", p, err)
			}
		})
	}
}

func TestJWKSURLConfig(t *testing.T) {
	rsaKey, _, ecKey, _ := keys(t)
	doc := jwksOf(t, jwkOf(&rsaKey.PublicKey, "r1"), jwkOf(&ecKey.PublicKey, "e1"))
	srv := newJWKSServer(t, doc)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(doc) }))
	defer plain.Close()
	for _, tt := range []struct {
		name string
		cfg  Config
		why  string
	}{
		{"http URL", Config{JWKSURL: plain.URL}, "must be an https:// URL"},
		{"untrusted CA", Config{JWKSURL: srv.URL}, "certificate"},
		{"unreachable", Config{JWKSURL: "https://127.0.0.1:1/jwks", JWKSRootCAs: srv.roots()}, "fetching the JWK Set"},
		{"with another source", Config{JWKSURL: srv.URL, JWKSRootCAs: srv.roots(), Secret: secret}, "exactly one"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.cfg)
			if err == nil {
				a.Close()
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("New = %v, want ErrConfig saying %q", err, tt.why)
			}
		})
	}

	a := newAuth(t, Config{JWKSURL: srv.URL, JWKSRootCAs: srv.roots(), JWKSUnknownKID: time.Hour})
	t.Cleanup(a.Close)
	good := claims("alice")
	for _, tt := range []struct {
		name  string
		token string
		want  string
		why   string
	}{
		{"RS256 with kid", sign(t, jwt.SigningMethodRS256, rsaKey, "r1", good), "alice", ""},
		{"ES256 without kid", sign(t, jwt.SigningMethodES256, ecKey, "", good), "alice", ""},
		{"alg none", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "r1", good), "", "signing method none is invalid"},
		{"HS256 keyed with the RSA public key", sign(t, jwt.SigningMethodHS256, pemOf(t, &rsaKey.PublicKey), "r1", good), "", "signing method HS256 is invalid"},
		{"PS256 with the right RSA key", sign(t, jwt.SigningMethodPS256, rsaKey, "r1", good), "", "signing method PS256 is invalid"},
		{"RS256 naming the EC key", sign(t, jwt.SigningMethodRS256, rsaKey, "e1", good), "", "verifies ES256, not RS256"},
		{"expired", sign(t, jwt.SigningMethodRS256, rsaKey, "r1", with(good, "exp", now.Add(-time.Second).Unix())), "", "expired"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := a.Verify(tt.token)
			if tt.want != "" {
				if p != tt.want || err != nil {
					t.Fatalf("Verify = %q, %v; want %q", p, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("Verify = %q, %v; want ErrInvalidToken saying %q", p, err, tt.why)
			}
		})
	}
	if got := strings.Join(a.Algorithms(), " "); got != "RS256 ES256 ES384" {
		t.Errorf("Algorithms() = %s, want RS256 ES256 ES384", got)
	}
}

func TestVerifyIdentity(t *testing.T) {
	a := newAuth(t, Config{Secret: secret, Leeway: 5 * time.Second})
	exp := now.Add(90 * time.Second)
	id, err := a.VerifyIdentity(sign(t, jwt.SigningMethodHS256, secret, "", with(claims("alice"), "exp", exp.Unix())))
	if err != nil || id.Subject != "alice" || !id.Expires.Equal(exp.Add(5*time.Second)) {
		t.Fatalf("VerifyIdentity = %+v, %v; want alice until %v", id, err, exp.Add(5*time.Second))
	}
}
