package auth

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzPrincipal feeds the handshake's authentication inputs (an Authorization header, a
// Cookie header and a raw query) to TokenFromRequest and Principal: they never panic, a token
// taken from a request is bounded and holds only JWT bytes, a refusal wraps ErrNoToken or
// ErrInvalidToken, and an accepted principal is a valid subject.
func FuzzPrincipal(f *testing.F) {
	a := newAuth(f, Config{Secret: secret})
	tok := sign(f, jwt.SigningMethodHS256, secret, "", claims("alice"))
	none := sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", claims("alice"))
	f.Add("Bearer "+tok, "", "")
	f.Add("", DefaultCookie+"="+tok, "")
	f.Add("", "", "runId=r&offset=-1&"+DefaultQueryParam+"="+tok)
	f.Add("Bearer "+none, "", "")
	f.Add("Basic dXNlcjpwYXNz", "", "")
	f.Add("", DefaultCookie+"=; other=1", DefaultQueryParam+"=a&"+DefaultQueryParam+"=b")
	f.Add("bearer  "+tok+"\x00", "", "%zz")
	f.Fuzz(func(t *testing.T, authorization, cookie, rawQuery string) {
		r := &http.Request{Header: http.Header{}, URL: &url.URL{Path: "/ws", RawQuery: rawQuery}}
		if authorization != "" {
			r.Header.Set("Authorization", authorization)
		}
		if cookie != "" {
			r.Header.Set("Cookie", cookie)
		}
		got, err := TokenFromRequest(r, DefaultCookie, DefaultQueryParam)
		if err == nil {
			if _, cerr := checkToken(got, "token"); cerr != nil {
				t.Fatalf("TokenFromRequest returned %q: %v", got, cerr)
			}
		} else if !errors.Is(err, ErrNoToken) && !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("TokenFromRequest error %v wraps neither ErrNoToken nor ErrInvalidToken", err)
		}
		p, err := a.Principal(r)
		switch {
		case err == nil && !validSubject(p):
			t.Fatalf("Principal accepted subject %q", p)
		case err != nil && (p != "" || (!errors.Is(err, ErrNoToken) && !errors.Is(err, ErrInvalidToken))):
			t.Fatalf("Principal = %q, %v", p, err)
		}
	})
}

// FuzzParseJWKS: ParseJWKS never panics, and every key it returns verifies exactly the
// algorithm of its type.
func FuzzParseJWKS(f *testing.F) {
	rsaKey, _, ecKey, _ := keys(f)
	f.Add(jwksOf(f, jwkOf(&rsaKey.PublicKey, "r1"), jwkOf(&ecKey.PublicKey, "e1")))
	f.Add([]byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"AAAA","y":"AAAA"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","d":"x"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseJWKS(data)
		if err != nil {
			if !errors.Is(err, ErrJWKS) {
				t.Fatalf("ParseJWKS error %v is not ErrJWKS", err)
			}
			return
		}
		for _, k := range keys {
			switch pub := k.Key.(type) {
			case *rsa.PublicKey:
				if k.Alg != "RS256" || pub.N.BitLen() < MinRSABits {
					t.Fatalf("RSA key of %d bits for %s", pub.N.BitLen(), k.Alg)
				}
			case *ecdsa.PublicKey:
				if k.Alg != "ES256" && k.Alg != "ES384" {
					t.Fatalf("EC key for %s", k.Alg)
				}
			default:
				t.Fatalf("key of type %T", k.Key)
			}
		}
	})
}
