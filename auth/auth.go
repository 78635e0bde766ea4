// Package auth authenticates the requests of the gateway's endpoints with JSON Web Tokens
// (RFC 7519), before a WebSocket upgrade.
//
// New builds an Authenticator from a Config holding exactly one key source: an HS256 secret
// (Config.Secret), PEM public keys (Config.PEM: RSA keys verify RS256, P-256 keys ES256,
// P-384 keys ES384), a JWK Set (Config.JWKS, parsed by ParseJWKS), or the HTTPS address of one
// (Config.JWKSURL: fetched by MicahParks/keyfunc over jwkset, cached, refreshed every
// Config.JWKSRefresh and for a token naming an unknown "kid" at most once per
// Config.JWKSUnknownKID, the last good set kept while fetches fail; Close stops the
// refreshes). Authenticator.Principal
// has the signature of conversation.Config.Principal: it takes the token from the request
// (TokenFromRequest: an "Authorization: Bearer" header, else the named cookie, else the named
// query parameter, since browsers cannot set headers on a WebSocket handshake), verifies it,
// and returns its subject ("sub") as the principal; Authenticator.Identify and VerifyIdentity
// return its expiry too, for sockets that outlive their handshake, and its BudgetClaim.
//
// Invariants:
//   - The accepted algorithms are pinned to the configured keys: a secret accepts HS256 only,
//     public keys only their own algorithm, so "none" and HS/RS confusion (a public key used as
//     an HMAC secret) are refused before any signature is checked. Keys fetched from
//     Config.JWKSURL are pinned the same way, key by key.
//   - "exp" is required and checked; "nbf" and "iat" are checked when present; "aud" and "iss"
//     are required and checked when Config.Audience and Config.Issuer are set.
//   - "sub" is required: non-empty printable UTF-8 of at most MaxSubjectLen bytes.
//   - A token longer than MaxTokenLen is refused unparsed, and so is a request that carries a
//     malformed Authorization header or the query parameter more than once.
//
// Every refusal wraps ErrNoToken (no token in the request) or ErrInvalidToken (a token that
// does not verify); the message says why, and never holds the token.
package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// Errors of the package; compare with errors.Is.
var (
	ErrConfig       = errors.New("auth: invalid config")
	ErrNoToken      = errors.New("auth: no token")
	ErrInvalidToken = errors.New("auth: invalid token")
)

// Limits.
const (
	// MaxTokenLen bounds the length of a token, in bytes.
	MaxTokenLen = 16 << 10
	// MaxSubjectLen bounds the length of a token's subject, in bytes.
	MaxSubjectLen = 256
	// MinSecretLen is the shortest HS256 secret accepted: the hash's output size (RFC 7518
	// section 3.2).
	MinSecretLen = 32
)

// Defaults of Config's zero fields.
const (
	DefaultCookie     = "wsgateway_token"
	DefaultQueryParam = "access_token"
)

// Config configures an Authenticator. Exactly one of Secret, PEM, JWKS and JWKSURL is set.
type Config struct {
	// Secret is an HS256 secret of at least MinSecretLen bytes.
	Secret []byte
	// PEM holds one or more public keys ("PUBLIC KEY", "RSA PUBLIC KEY" or "CERTIFICATE"
	// blocks). RSA keys (2048 bits or more) verify RS256, P-256 keys ES256, P-384 keys ES384.
	PEM []byte
	// JWKS is a JWK Set document (RFC 7517), as ParseJWKS reads it.
	JWKS []byte
	// JWKSURL is the https:// address of a JWK Set (an identity provider's jwks_uri). New
	// fetches it once and fails if it cannot; plain http:// is refused, since whoever can
	// change the set in transit can sign tokens.
	JWKSURL string
	// JWKSRootCAs are the CAs trusted for JWKSURL (default: the system's).
	JWKSRootCAs *x509.CertPool
	// JWKSRefresh is the period of the scheduled fetch of JWKSURL (default
	// DefaultJWKSRefresh); JWKSUnknownKID the least time between fetches caused by tokens
	// naming an unknown "kid" (default DefaultJWKSUnknownKID).
	JWKSRefresh    time.Duration
	JWKSUnknownKID time.Duration
	// Logger receives the failures of scheduled JWK Set fetches (default: discard).
	Logger *slog.Logger
	// Audience, if set, must be among the token's "aud".
	Audience string
	// Issuer, if set, must equal the token's "iss".
	Issuer string
	// Cookie names the cookie that may carry the token (default DefaultCookie); "-" disables
	// cookies.
	Cookie string
	// QueryParam names the query parameter that may carry the token (default
	// DefaultQueryParam); "-" disables it.
	QueryParam string
	// Leeway is the clock skew allowed on exp, nbf and iat (default none).
	Leeway time.Duration
	// Now returns the current time (default time.Now); tests set it.
	Now func() time.Time
}

// key is a verification key and the one algorithm it verifies.
type key struct {
	kid string // "" when the source names none
	alg string
	pub any // []byte, *rsa.PublicKey or *ecdsa.PublicKey
}

// Authenticator verifies tokens. It is safe for concurrent use.
type Authenticator struct {
	keys       []key
	remote     *remoteKeys // Config.JWKSURL; nil otherwise
	leeway     time.Duration
	parser     *jwt.Parser
	cookie     string
	queryParam string
}

// New validates cfg and returns an Authenticator.
func New(cfg Config) (*Authenticator, error) {
	sources := 0
	for _, s := range [][]byte{cfg.Secret, cfg.PEM, cfg.JWKS, []byte(cfg.JWKSURL)} {
		if len(s) > 0 {
			sources++
		}
	}
	if sources != 1 {
		return nil, fmt.Errorf("%w: want exactly one of a secret, PEM public keys, a JWK Set or its URL", ErrConfig)
	}
	if cfg.Leeway < 0 {
		return nil, fmt.Errorf("%w: negative leeway", ErrConfig)
	}
	var keys []key
	var remote *remoteKeys
	switch {
	case len(cfg.Secret) > 0:
		if len(cfg.Secret) < MinSecretLen {
			return nil, fmt.Errorf("%w: an HS256 secret needs at least %d bytes, got %d", ErrConfig, MinSecretLen, len(cfg.Secret))
		}
		keys = []key{{alg: jwt.SigningMethodHS256.Alg(), pub: append([]byte(nil), cfg.Secret...)}}
	case len(cfg.PEM) > 0:
		var err error
		if keys, err = parsePEM(cfg.PEM); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	case cfg.JWKSURL != "":
		var err error
		if remote, err = newRemoteKeys(cfg); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	default:
		set, err := ParseJWKS(cfg.JWKS)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		for _, k := range set {
			keys = append(keys, key{kid: k.KID, alg: k.Alg, pub: k.Key})
		}
	}
	methods := algorithms(keys)
	if remote != nil {
		methods = jwksAlgorithms
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithIssuedAt(),
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	a := &Authenticator{keys: keys, remote: remote, leeway: cfg.Leeway, parser: jwt.NewParser(opts...), cookie: cfg.Cookie, queryParam: cfg.QueryParam}
	if a.cookie == "" {
		a.cookie = DefaultCookie
	}
	if a.queryParam == "" {
		a.queryParam = DefaultQueryParam
	}
	if a.cookie == "-" {
		a.cookie = ""
	}
	if a.queryParam == "-" {
		a.queryParam = ""
	}
	return a, nil
}

// Algorithms returns the algorithms the Authenticator accepts, e.g. [HS256].
func (a *Authenticator) Algorithms() []string {
	if a.remote != nil {
		return append([]string(nil), jwksAlgorithms...)
	}
	return algorithms(a.keys)
}

// Close stops the refreshes of Config.JWKSURL; tokens of the keys fetched so far still
// verify. It is idempotent, and does nothing for the other key sources.
func (a *Authenticator) Close() {
	if a.remote != nil {
		a.remote.close()
	}
}

// algorithms returns the distinct algorithms of keys, in order.
func algorithms(keys []key) []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range keys {
		if !seen[k.alg] {
			seen[k.alg] = true
			out = append(out, k.alg)
		}
	}
	return out
}

// Principal returns the subject of the request's token. It has the signature of
// conversation.Config.Principal.
func (a *Authenticator) Principal(r *http.Request) (string, error) {
	tok, err := TokenFromRequest(r, a.cookie, a.queryParam)
	if err != nil {
		return "", err
	}
	return a.Verify(tok)
}

// Verify checks a token's signature and claims and returns its subject.
func (a *Authenticator) Verify(token string) (string, error) {
	id, err := a.VerifyIdentity(token)
	return id.Subject, err
}

// Identity is what a verified token says: who, and until when.
type Identity struct {
	Subject string
	// Expires is the token's "exp" plus Config.Leeway: the last instant it verifies.
	Expires time.Time
	// TokenBudget is the token's BudgetClaim, -1 when it has none.
	TokenBudget int64
}

// BudgetClaim names the claim that gives a token's principal its own budget of tokens per
// period (the gateway's --token-budget): a non-negative integer, 0 for no budget. A token
// whose claim is anything else is refused.
const BudgetClaim = "wsgateway_token_budget"

// tokenClaims are the claims a token is read for.
type tokenClaims struct {
	jwt.RegisteredClaims
	TokenBudget json.RawMessage `json:"wsgateway_token_budget"`
}

// tokenBudget returns the value of BudgetClaim in raw, -1 when absent.
func tokenBudget(raw json.RawMessage) (int64, error) {
	if raw == nil {
		return -1, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: the %s claim must be a non-negative integer", ErrInvalidToken, BudgetClaim)
	}
	return n, nil
}

// Identify is Principal returning the token's expiry too.
func (a *Authenticator) Identify(r *http.Request) (Identity, error) {
	tok, err := TokenFromRequest(r, a.cookie, a.queryParam)
	if err != nil {
		return Identity{}, err
	}
	return a.VerifyIdentity(tok)
}

// VerifyIdentity is Verify returning the token's expiry too.
func (a *Authenticator) VerifyIdentity(token string) (Identity, error) {
	if len(token) > MaxTokenLen {
		return Identity{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalidToken, MaxTokenLen)
	}
	var c tokenClaims
	if _, err := a.parser.ParseWithClaims(token, &c, a.keyFor); err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if !validSubject(c.Subject) {
		return Identity{}, fmt.Errorf("%w: the subject (sub) must be non-empty printable text of at most %d bytes", ErrInvalidToken, MaxSubjectLen)
	}
	budget, err := tokenBudget(c.TokenBudget)
	if err != nil {
		return Identity{}, err
	}
	// The parser requires exp.
	return Identity{Subject: c.Subject, Expires: c.ExpiresAt.Add(a.leeway), TokenBudget: budget}, nil
}

// keyFor returns the keys that may verify t: those of its algorithm (WithValidMethods has
// already refused any other), and of its key id when both name one.
func (a *Authenticator) keyFor(t *jwt.Token) (any, error) {
	if a.remote != nil {
		return a.remote.keyFor(t)
	}
	alg := t.Method.Alg()
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	for _, k := range a.keys {
		if k.alg == alg && (kid == "" || k.kid == "" || k.kid == kid) {
			set.Keys = append(set.Keys, k.pub)
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key for algorithm %s and key id %q", alg, kid)
	}
	return set, nil
}

func validSubject(s string) bool {
	if s == "" || len(s) > MaxSubjectLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// parsePEM reads the public keys of PEM blocks.
func parsePEM(data []byte) ([]key, error) {
	var keys []key
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var pub any
		var err error
		switch block.Type {
		case "PUBLIC KEY":
			pub, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				pub = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("PEM block %q: want a public key or a certificate (never a private key)", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("PEM block %q: %w", block.Type, err)
		}
		alg, err := algorithmOf(pub)
		if err != nil {
			return nil, fmt.Errorf("PEM block %q: %w", block.Type, err)
		}
		keys = append(keys, key{alg: alg, pub: pub})
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM public key found")
	}
	return keys, nil
}

// MinRSABits is the smallest RSA modulus accepted.
const MinRSABits = 2048

// algorithmOf returns the one algorithm a public key verifies.
func algorithmOf(pub any) (string, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < MinRSABits {
			return "", fmt.Errorf("RSA key of %d bits: want at least %d", k.N.BitLen(), MinRSABits)
		}
		return jwt.SigningMethodRS256.Alg(), nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return jwt.SigningMethodES256.Alg(), nil
		case elliptic.P384():
			return jwt.SigningMethodES384.Alg(), nil
		}
		return "", fmt.Errorf("EC key on curve %s: want P-256 or P-384", k.Curve.Params().Name)
	}
	return "", fmt.Errorf("unsupported key type %T: want RSA or EC", pub)
}
