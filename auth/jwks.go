package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// ErrJWKS reports a JWK Set that cannot be used.
var ErrJWKS = errors.New("auth: invalid JWK Set")

// JWK is one verification key of a JWK Set.
type JWK struct {
	KID string // "kid"; may be empty
	Alg string // the one algorithm it verifies: RS256, ES256 or ES384
	Key any    // *rsa.PublicKey or *ecdsa.PublicKey
}

// jwk holds the members of a JSON Web Key that ParseJWKS reads (RFC 7517 section 4, RFC 7518
// section 6).
type jwk struct {
	Kty string          `json:"kty"`
	Use string          `json:"use"`
	Alg string          `json:"alg"`
	KID string          `json:"kid"`
	N   string          `json:"n"`
	E   string          `json:"e"`
	Crv string          `json:"crv"`
	X   string          `json:"x"`
	Y   string          `json:"y"`
	D   json.RawMessage `json:"d"`
	K   json.RawMessage `json:"k"`
}

// maxJWKSLen bounds a JWK Set document.
const maxJWKSLen = 1 << 20

// ParseJWKS reads the public signature keys of a JWK Set (RFC 7517 section 5): RSA keys of
// at least MinRSABits bits (RS256) and EC keys on P-256 (ES256) or P-384 (ES384). Keys of
// another type, or whose "use" is not "sig", are ignored, as RFC 7517 asks; a key whose "alg"
// names another algorithm than its type verifies is ignored too, since the algorithm is
// pinned to the key. A malformed key of a supported type, a key with private members ("d" or
// "k"), two keys with the same "kid", and a set without any usable key are errors (ErrJWKS).
func ParseJWKS(data []byte) ([]JWK, error) {
	if len(data) > maxJWKSLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrJWKS, maxJWKSLen)
	}
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrJWKS, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrJWKS)
	}
	if doc.Keys == nil {
		return nil, fmt.Errorf("%w: no \"keys\" array", ErrJWKS)
	}
	var out []JWK
	kids := map[string]bool{}
	for i, raw := range doc.Keys {
		var k jwk
		if err := json.Unmarshal(raw, &k); err != nil {
			return nil, fmt.Errorf("%w: key %d: %v", ErrJWKS, i, err)
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if len(k.D) > 0 || len(k.K) > 0 {
			return nil, fmt.Errorf("%w: key %d holds private key material; publish public keys only", ErrJWKS, i)
		}
		var pub any
		var err error
		switch k.Kty {
		case "RSA":
			pub, err = k.rsaKey()
		case "EC":
			pub, err = k.ecKey()
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: key %d (kid %q): %v", ErrJWKS, i, k.KID, err)
		}
		alg, err := algorithmOf(pub)
		if err != nil {
			return nil, fmt.Errorf("%w: key %d (kid %q): %v", ErrJWKS, i, k.KID, err)
		}
		if k.Alg != "" && k.Alg != alg {
			continue
		}
		if k.KID != "" {
			if kids[k.KID] {
				return nil, fmt.Errorf("%w: two keys with kid %q", ErrJWKS, k.KID)
			}
			kids[k.KID] = true
		}
		out = append(out, JWK{KID: k.KID, Alg: alg, Key: pub})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no RSA or EC signature key", ErrJWKS)
	}
	return out, nil
}

func (k *jwk) rsaKey() (*rsa.PublicKey, error) {
	n, err := b64uint(k.N, "n")
	if err != nil {
		return nil, err
	}
	e, err := b64uint(k.E, "e")
	if err != nil {
		return nil, err
	}
	if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
		return nil, errors.New(`"e" must be an odd exponent from 3 to 2^31-1`)
	}
	return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
}

func (k *jwk) ecKey() (*ecdsa.PublicKey, error) {
	var curve elliptic.Curve
	switch k.Crv {
	case "P-256":
		curve = elliptic.P256()
	case "P-384":
		curve = elliptic.P384()
	default:
		return nil, fmt.Errorf("curve %q: want P-256 or P-384", k.Crv)
	}
	size := (curve.Params().BitSize + 7) / 8
	x, err := b64(k.X, "x")
	if err != nil {
		return nil, err
	}
	y, err := b64(k.Y, "y")
	if err != nil {
		return nil, err
	}
	if len(x) != size || len(y) != size {
		return nil, fmt.Errorf(`"x" and "y" must be %d bytes each on %s`, size, k.Crv)
	}
	point := append(append([]byte{4}, x...), y...)
	pub, err := ecdsa.ParseUncompressedPublicKey(curve, point)
	if err != nil {
		return nil, fmt.Errorf("not a point of %s: %v", k.Crv, err)
	}
	return pub, nil
}

// b64 decodes a base64url member without padding (RFC 7515 section 2).
func b64(s, member string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("%q is missing", member)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return nil, fmt.Errorf("%q is not base64url: %v", member, err)
	}
	return b, nil
}

// b64uint decodes a base64urlUInt member (RFC 7518 section 2): a big-endian unsigned
// integer. Leading zero bytes, which some issuers publish, are tolerated.
func b64uint(s, member string) (*big.Int, error) {
	b, err := b64(s, member)
	if err != nil {
		return nil, err
	}
	return new(big.Int).SetBytes(b), nil
}
