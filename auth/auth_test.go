package auth

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestVerify(t *testing.T) {
	rsaKey, rsaKey2, ecKey, ecKey2 := keys(t)
	hs := newAuth(t, Config{Secret: secret})
	hsAud := newAuth(t, Config{Secret: secret, Audience: "wsgateway", Issuer: "https://issuer.example"})
	rs := newAuth(t, Config{PEM: pemOf(t, &rsaKey.PublicKey)})
	es := newAuth(t, Config{PEM: pemOf(t, &ecKey.PublicKey)})
	jwks := newAuth(t, Config{JWKS: jwksOf(t, jwkOf(&rsaKey.PublicKey, "r1"), jwkOf(&ecKey.PublicKey, "e1"), jwkOf(&ecKey2.PublicKey, "e2"))})
	rsaPEM := pemOf(t, &rsaKey.PublicKey)
	good := claims("alice")
	noneToken := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", good)

	tests := []struct {
		name  string
		a     *Authenticator
		token string
		want  string // the principal; "" for a refusal
		why   string // in the refusal's message
	}{
		{"HS256", hs, sign(t, jwt.SigningMethodHS256, secret, "", good), "alice", ""},
		{"HS256 with leeway-free expiry one second ago", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "exp", now.Add(-time.Second).Unix())), "", "token is expired"},
		{"not valid yet", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "nbf", now.Add(time.Minute).Unix())), "", "token is not valid yet"},
		{"issued in the future", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "iat", now.Add(time.Minute).Unix())), "", "token used before issued"},
		{"no exp", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "exp", nil)), "", "exp claim is required"},
		{"wrong secret", hs, sign(t, jwt.SigningMethodHS256, []byte("another secret of thirty-two bytes!"), "", good), "", "signature is invalid"},
		{"alg none", hs, noneToken, "", "signing method none is invalid"},
		{"HS384 with the right secret", hs, sign(t, jwt.SigningMethodHS384, secret, "", good), "", "signing method HS384 is invalid"},
		{"no sub", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "sub", nil)), "", "subject (sub)"},
		{"empty sub", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "sub", "")), "", "subject (sub)"},
		{"sub with a control character", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "sub", "al\nice")), "", "subject (sub)"},
		{"sub too long", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "sub", strings.Repeat("a", MaxSubjectLen+1))), "", "subject (sub)"},
		{"sub not a string", hs, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "sub", 42)), "", "sub"},
		{"audience and issuer", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "aud", "wsgateway", "iss", "https://issuer.example")), "alice", ""},
		{"audience among several", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "aud", []string{"other", "wsgateway"}, "iss", "https://issuer.example")), "alice", ""},
		{"wrong audience", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "aud", "other", "iss", "https://issuer.example")), "", "invalid audience"},
		{"no audience", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "iss", "https://issuer.example")), "", "aud claim is required"},
		{"wrong issuer", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "aud", "wsgateway", "iss", "https://evil.example")), "", "invalid issuer"},
		{"no issuer", hsAud, sign(t, jwt.SigningMethodHS256, secret, "", with(good, "aud", "wsgateway")), "", "iss claim is required"},
		{"RS256", rs, sign(t, jwt.SigningMethodRS256, rsaKey, "", good), "alice", ""},
		{"RS256 of another key", rs, sign(t, jwt.SigningMethodRS256, rsaKey2, "", good), "", "verification error"},
		{"HS256 keyed with the RSA public key (confusion)", rs, sign(t, jwt.SigningMethodHS256, rsaPEM, "", good), "", "signing method HS256 is invalid"},
		{"RS256 token for an HS256 gateway", hs, sign(t, jwt.SigningMethodRS256, rsaKey, "", good), "", "signing method RS256 is invalid"},
		{"PS256 with the right RSA key", rs, sign(t, jwt.SigningMethodPS256, rsaKey, "", good), "", "signing method PS256 is invalid"},
		{"alg none for RS256", rs, noneToken, "", "signing method none is invalid"},
		{"ES256", es, sign(t, jwt.SigningMethodES256, ecKey, "", good), "alice", ""},
		{"ES256 of another key", es, sign(t, jwt.SigningMethodES256, ecKey2, "", good), "", "verification error"},
		{"JWKS RS256 by kid", jwks, sign(t, jwt.SigningMethodRS256, rsaKey, "r1", good), "alice", ""},
		{"JWKS ES256 by kid", jwks, sign(t, jwt.SigningMethodES256, ecKey2, "e2", good), "alice", ""},
		{"JWKS ES256 without kid", jwks, sign(t, jwt.SigningMethodES256, ecKey2, "", good), "alice", ""},
		{"JWKS unknown kid", jwks, sign(t, jwt.SigningMethodES256, ecKey, "e9", good), "", "no key for algorithm ES256"},
		{"JWKS kid of another key", jwks, sign(t, jwt.SigningMethodES256, ecKey, "e2", good), "", "verification error"},
		{"JWKS key unknown", jwks, sign(t, jwt.SigningMethodRS256, rsaKey2, "", good), "", "verification error"},
		{"malformed", hs, "not.a.token", "", "token is malformed"},
		{"two parts", hs, "abc.def", "", "token is malformed"},
		{"empty", hs, "", "", "token is malformed"},
		{"too long", hs, strings.Repeat("a", MaxTokenLen+1), "", "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.a.Verify(tt.token)
			if tt.want != "" {
				if err != nil || got != tt.want {
					t.Fatalf("Verify = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tt.why) || got != "" {
				t.Fatalf("Verify = %q, %v; want ErrInvalidToken saying %q", got, err, tt.why)
			}
		})
	}
}

func TestLeeway(t *testing.T) {
	a := newAuth(t, Config{Secret: secret, Leeway: 30 * time.Second})
	tok := sign(t, jwt.SigningMethodHS256, secret, "", with(claims("bob"), "exp", now.Add(-10*time.Second).Unix()))
	if got, err := a.Verify(tok); err != nil || got != "bob" {
		t.Errorf("Verify(expired 10s ago, leeway 30s) = %q, %v; want bob", got, err)
	}
}

func TestNewErrors(t *testing.T) {
	rsaKey, _, _, _ := keys(t)
	small := smallRSAPEM(t)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no key", Config{}, "exactly one"},
		{"two keys", Config{Secret: secret, PEM: pemOf(t, &rsaKey.PublicKey)}, "exactly one"},
		{"short secret", Config{Secret: []byte("short")}, "at least 32 bytes"},
		{"PEM private key", Config{PEM: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}, "never a private key"},
		{"PEM garbage", Config{PEM: []byte("hello")}, "no PEM public key"},
		{"PEM small RSA", Config{PEM: small}, "want at least 2048"},
		{"JWKS garbage", Config{JWKS: []byte("{")}, "invalid JWK Set"},
		{"negative leeway", Config{Secret: secret, Leeway: -time.Second}, "negative leeway"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%s) = %v, want ErrConfig saying %q", tt.name, err, tt.want)
		}
	}
}

func TestAlgorithms(t *testing.T) {
	rsaKey, _, ecKey, _ := keys(t)
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Secret: secret}, "HS256"},
		{Config{PEM: pemOf(t, &rsaKey.PublicKey)}, "RS256"},
		{Config{PEM: append(pemOf(t, &rsaKey.PublicKey), pemOf(t, &ecKey.PublicKey)...)}, "RS256 ES256"},
		{Config{JWKS: jwksOf(t, jwkOf(&ecKey.PublicKey, ""))}, "ES256"},
	}
	for _, tt := range tests {
		if got := strings.Join(newAuth(t, tt.cfg).Algorithms(), " "); got != tt.want {
			t.Errorf("Algorithms() = %s, want %s", got, tt.want)
		}
	}
}

func TestPrincipal(t *testing.T) {
	a := newAuth(t, Config{Secret: secret})
	tok := sign(t, jwt.SigningMethodHS256, secret, "", claims("carol"))
	custom := newAuth(t, Config{Secret: secret, Cookie: "sess", QueryParam: "t"})
	noCookie := newAuth(t, Config{Secret: secret, Cookie: "-", QueryParam: "-"})
	tests := []struct {
		name string
		a    *Authenticator
		req  func() *http.Request
		want string
		err  error
	}{
		{"bearer", a, func() *http.Request {
			r := httptest.NewRequest("GET", "/ws", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			return r
		}, "carol", nil},
		{"cookie", a, func() *http.Request {
			r := httptest.NewRequest("GET", "/ws", nil)
			r.AddCookie(&http.Cookie{Name: DefaultCookie, Value: tok})
			return r
		}, "carol", nil},
		{"query", a, func() *http.Request { return httptest.NewRequest("GET", "/ws?access_token="+tok, nil) }, "carol", nil},
		{"custom cookie", custom, func() *http.Request {
			r := httptest.NewRequest("GET", "/ws", nil)
			r.AddCookie(&http.Cookie{Name: "sess", Value: tok})
			return r
		}, "carol", nil},
		{"custom query", custom, func() *http.Request { return httptest.NewRequest("GET", "/ws?t="+tok, nil) }, "carol", nil},
		{"default query ignored when renamed", custom, func() *http.Request { return httptest.NewRequest("GET", "/ws?access_token="+tok, nil) }, "", ErrNoToken},
		{"cookie disabled", noCookie, func() *http.Request {
			r := httptest.NewRequest("GET", "/ws?access_token="+tok, nil)
			r.AddCookie(&http.Cookie{Name: DefaultCookie, Value: tok})
			return r
		}, "", ErrNoToken},
		{"nothing", a, func() *http.Request { return httptest.NewRequest("GET", "/ws", nil) }, "", ErrNoToken},
		{"bad bearer", a, func() *http.Request {
			r := httptest.NewRequest("GET", "/ws", nil)
			r.Header.Set("Authorization", "Bearer garbage")
			return r
		}, "", ErrInvalidToken},
	}
	for _, tt := range tests {
		got, err := tt.a.Principal(tt.req())
		if got != tt.want || !errors.Is(err, tt.err) {
			t.Errorf("Principal(%s) = %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

func TestTokenFromRequest(t *testing.T) {
	tests := []struct {
		name    string
		headers []string // Authorization values
		cookie  string   // value of cookie "c"
		query   string
		want    string
		err     error
		why     string
	}{
		{"bearer", []string{"Bearer a.b.c"}, "", "", "a.b.c", nil, ""},
		{"bearer lower case", []string{"bearer a.b.c"}, "", "", "a.b.c", nil, ""},
		{"bearer wins over cookie and query", []string{"Bearer h.h.h"}, "c.c.c", "q=q.q.q", "h.h.h", nil, ""},
		{"cookie wins over query", nil, "c.c.c", "q=q.q.q", "c.c.c", nil, ""},
		{"query", nil, "", "q=q.q.q", "q.q.q", nil, ""},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, "", "", "", ErrInvalidToken, `not "Bearer <token>"`},
		{"bearer alone", []string{"Bearer"}, "", "", "", ErrInvalidToken, `not "Bearer <token>"`},
		{"bearer empty", []string{"Bearer "}, "", "", "", ErrInvalidToken, "is empty"},
		{"two headers", []string{"Bearer a.b.c", "Bearer d.e.f"}, "", "", "", ErrInvalidToken, "more than one"},
		{"bearer with space inside", []string{"Bearer a.b c"}, "", "", "", ErrInvalidToken, "byte that no JWT holds"},
		{"query twice", nil, "", "q=a.b.c&q=d.e.f", "", ErrInvalidToken, "given 2 times"},
		{"query empty", nil, "", "q=", "", ErrInvalidToken, "is empty"},
		{"query with NUL", nil, "", "q=a%00b", "", ErrInvalidToken, "byte that no JWT holds"},
		{"query with CRLF", nil, "", "q=a%0D%0Ab", "", ErrInvalidToken, "byte that no JWT holds"},
		{"query too long", nil, "", "q=" + strings.Repeat("a", MaxTokenLen+1), "", ErrInvalidToken, "longer than"},
		{"nothing", nil, "", "other=1", "", ErrNoToken, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/ws?"+tt.query, nil)
			for _, h := range tt.headers {
				r.Header.Add("Authorization", h)
			}
			if tt.cookie != "" {
				r.AddCookie(&http.Cookie{Name: "c", Value: tt.cookie})
			}
			got, err := TokenFromRequest(r, "c", "q")
			if got != tt.want || !errors.Is(err, tt.err) || (tt.why != "" && !strings.Contains(err.Error(), tt.why)) {
				t.Errorf("TokenFromRequest = %q, %v; want %q, %v saying %q", got, err, tt.want, tt.err, tt.why)
			}
		})
	}
}

// TestBudgetClaim: a token's BudgetClaim reaches its Identity; a token without it has none
// (-1); a claim that is not a non-negative integer refuses the token, saying why.
func TestBudgetClaim(t *testing.T) {
	a := newAuth(t, Config{Secret: secret})
	for _, tt := range []struct {
		name  string
		claim any // nil: absent
		want  int64
		why   string
	}{
		{"absent", nil, -1, ""},
		{"a budget", 50000, 50000, ""},
		{"no budget", 0, 0, ""},
		{"negative", -1, 0, "wsgateway_token_budget claim must be a non-negative integer"},
		{"fractional", 1.5, 0, "wsgateway_token_budget claim must be a non-negative integer"},
		{"a string", "100", 0, "wsgateway_token_budget claim must be a non-negative integer"},
	} {
		id, err := a.VerifyIdentity(sign(t, jwt.SigningMethodHS256, secret, "", with(claims("alice"), BudgetClaim, tt.claim)))
		switch {
		case tt.why == "" && (err != nil || id.TokenBudget != tt.want || id.Subject != "alice"):
			t.Errorf("%s: VerifyIdentity() = %+v, %v; want budget %d", tt.name, id, err, tt.want)
		case tt.why != "" && (!errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tt.why)):
			t.Errorf("%s: VerifyIdentity() error = %v, want ErrInvalidToken saying %q", tt.name, err, tt.why)
		}
	}
}
