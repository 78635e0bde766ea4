package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

func TestParseJWKS(t *testing.T) {
	rsaKey, _, ecKey, _ := keys(t)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaJWK := jwkOf(&rsaKey.PublicKey, "r1")
	ecJWK := jwkOf(&ecKey.PublicKey, "e1")
	set := func(keys ...map[string]any) []byte { return jwksOf(t, keys...) }
	edit := func(k map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for n, v := range k {
			out[n] = v
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
	tests := []struct {
		name string
		doc  []byte
		want string // "kid:alg ..." of the keys, or "" for an error
		why  string // in the error
	}{
		{"RSA and EC", set(rsaJWK, ecJWK), "r1:RS256 e1:ES256", ""},
		{"P-384", set(jwkOf(&p384.PublicKey, "p")), "p:ES384", ""},
		{"alg that matches", set(edit(rsaJWK, "alg", "RS256")), "r1:RS256", ""},
		{"alg of another algorithm is skipped", set(edit(rsaJWK, "alg", "RS512"), ecJWK), "e1:ES256", ""},
		{"encryption key is skipped", set(edit(rsaJWK, "use", "enc"), ecJWK), "e1:ES256", ""},
		{"unknown kty is skipped", set(map[string]any{"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}, ecJWK), "e1:ES256", ""},
		{"padded base64 is tolerated", set(edit(ecJWK, "x", ecJWK["x"].(string)+"=")), "e1:ES256", ""},
		{"without kid", set(edit(ecJWK, "kid", nil)), ":ES256", ""},
		{"only skipped keys", set(edit(rsaJWK, "use", "enc")), "", "no RSA or EC signature key"},
		{"empty set", []byte(`{"keys":[]}`), "", "no RSA or EC signature key"},
		{"no keys member", []byte(`{}`), "", `no "keys" array`},
		{"not JSON", []byte(`keys`), "", "invalid JWK Set"},
		{"trailing data", append(set(ecJWK), []byte(" {}")...), "", "data after the JSON object"},
		{"keys not an array", []byte(`{"keys":{}}`), "", "invalid JWK Set"},
		{"key not an object", []byte(`{"keys":[1]}`), "", "key 0"},
		{"private RSA", set(edit(rsaJWK, "d", "AAAA")), "", "private key material"},
		{"symmetric key", set(map[string]any{"kty": "oct", "k": "AAAA"}), "", "private key material"},
		{"duplicate kid", set(rsaJWK, edit(ecJWK, "kid", "r1")), "", `two keys with kid "r1"`},
		{"RSA without n", set(edit(rsaJWK, "n", nil)), "", `"n" is missing`},
		{"RSA n not base64url", set(edit(rsaJWK, "n", "a+b/")), "", `"n" is not base64url`},
		{"RSA small modulus", set(edit(rsaJWK, "n", "AQAB")), "", "want at least 2048"},
		{"RSA even exponent", set(edit(rsaJWK, "e", "Ag")), "", `"e" must be an odd exponent`},
		{"RSA huge exponent", set(edit(rsaJWK, "e", "AQAAAAAB")), "", `"e" must be an odd exponent`},
		{"EC unknown curve", set(edit(ecJWK, "crv", "P-521")), "", "want P-256 or P-384"},
		{"EC short x", set(edit(ecJWK, "x", "AAAA")), "", "must be 32 bytes"},
		{"EC point off the curve", set(edit(ecJWK, "y", ecJWK["x"])), "", "not a point of P-256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := ParseJWKS(tt.doc)
			if tt.want == "" {
				if !errors.Is(err, ErrJWKS) || !strings.Contains(err.Error(), tt.why) {
					t.Fatalf("ParseJWKS = %v, want ErrJWKS saying %q", err, tt.why)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseJWKS: %v", err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.KID+":"+k.Alg)
			}
			if strings.Join(got, " ") != tt.want {
				t.Errorf("ParseJWKS = %s, want %s", strings.Join(got, " "), tt.want)
			}
		})
	}
}
