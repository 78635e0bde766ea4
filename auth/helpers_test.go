package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// now is the fixed clock of the tests.
var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func clock() time.Time { return now }

var secret = []byte("0123456789abcdef0123456789abcdef") // 32 bytes

// testKeys are generated once: RSA generation is slow under the race detector.
var testKeys struct {
	once sync.Once
	rsa  *rsa.PrivateKey
	rsa2 *rsa.PrivateKey
	ec   *ecdsa.PrivateKey
	ec2  *ecdsa.PrivateKey
}

func keys(tb testing.TB) (rsaKey, rsaKey2 *rsa.PrivateKey, ecKey, ecKey2 *ecdsa.PrivateKey) {
	tb.Helper()
	testKeys.once.Do(func() {
		var err error
		if testKeys.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if testKeys.rsa2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if testKeys.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if testKeys.ec2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
	})
	return testKeys.rsa, testKeys.rsa2, testKeys.ec, testKeys.ec2
}

// claims returns valid claims for subject sub: issued a minute ago, expiring in an hour.
func claims(sub string) jwt.MapClaims {
	return jwt.MapClaims{
		"sub": sub,
		"iat": now.Add(-time.Minute).Unix(),
		"exp": now.Add(time.Hour).Unix(),
	}
}

// with returns a copy of c with the given claims set (a nil value deletes the claim).
func with(c jwt.MapClaims, kv ...any) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

// sign returns the compact token of claims signed with method and key, with header kid if
// not empty.
func sign(tb testing.TB, method jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	tb.Helper()
	t := jwt.NewWithClaims(method, c)
	if kid != "" {
		t.Header["kid"] = kid
	}
	s, err := t.SignedString(key)
	if err != nil {
		tb.Fatalf("sign %s: %v", method.Alg(), err)
	}
	return s
}

// pemOf encodes a public key as a PKIX PEM block.
func pemOf(tb testing.TB, pub any) []byte {
	tb.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// jwkOf returns the JWK members of a public key.
func jwkOf(pub any, kid string) map[string]any {
	enc := base64.RawURLEncoding.EncodeToString
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "n": enc(k.N.Bytes()), "e": enc(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PublicKey:
		b, err := k.Bytes()
		if err != nil {
			panic(err)
		}
		size := (len(b) - 1) / 2
		return map[string]any{"kty": "EC", "kid": kid, "crv": k.Curve.Params().Name, "x": enc(b[1 : 1+size]), "y": enc(b[1+size:])}
	}
	panic("unsupported key")
}

// jwksOf returns a JWK Set document of keys.
func jwksOf(tb testing.TB, keys ...map[string]any) []byte {
	tb.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// newAuth returns an Authenticator of cfg on the test clock.
func newAuth(tb testing.TB, cfg Config) *Authenticator {
	tb.Helper()
	cfg.Now = clock
	a, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return a
}

// smallRSAPEM returns the PEM of a 1024-bit RSA public key, too small to be accepted.
func smallRSAPEM(tb testing.TB) []byte {
	tb.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		tb.Fatal(err)
	}
	return pemOf(tb, &k.PublicKey)
}
