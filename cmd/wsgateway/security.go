package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/wsgateway/wsgateway/auth"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/turn"
	ledger "github.com/wsgateway/wsgateway/usage"
)

// maxHeaderBytes bounds a request's headers (net/http answers 431 beyond): a handshake needs a
// few hundred bytes, a token at most auth.MaxTokenLen.
const maxHeaderBytes = 64 << 10

// Log attribute keys of the security set-up.
const (
	keyRemote  = "remote"
	keyOrigins = "allowed_origins"
)

// newAuthenticator returns the Authenticator of --auth and a description of the mode for the
// start line. With --auth none it returns nil (every client is the default principal) and
// logs a warning. The caller closes the Authenticator (it stops the refreshes of
// --jwt-jwks-url).
func newAuthenticator(cfg serveConfig, getenv func(string) (string, bool), log *slog.Logger) (*auth.Authenticator, string, error) {
	if cfg.auth == authNone {
		log.Warn("authentication is off (--auth none): every client is one principal and may resume, join and abort every run; use it for development only")
		return nil, "off (development mode: no authentication)", nil
	}
	acfg := auth.Config{
		Audience:   cfg.jwtAudience,
		Issuer:     cfg.jwtIssuer,
		Cookie:     cfg.jwtCookie,
		QueryParam: cfg.jwtQueryParam,
	}
	var err error
	switch {
	case cfg.jwtSecretEnv != "":
		secret, ok := getenv(cfg.jwtSecretEnv)
		if !ok || secret == "" {
			return nil, "", fmt.Errorf("%w: --jwt-secret-env: the environment variable %s is not set", errUsage, cfg.jwtSecretEnv)
		}
		acfg.Secret = []byte(secret)
	case cfg.jwtKeyFile != "":
		if acfg.PEM, err = os.ReadFile(cfg.jwtKeyFile); err != nil {
			return nil, "", fmt.Errorf("%w: --jwt-key-file: %v", errUsage, err)
		}
	case cfg.jwtJWKSURL != "":
		acfg.JWKSURL, acfg.JWKSRefresh, acfg.Logger = cfg.jwtJWKSURL, cfg.jwtJWKSRefresh, log
		if cfg.jwtJWKSCA != "" {
			if acfg.JWKSRootCAs, err = certPool(cfg.jwtJWKSCA); err != nil {
				return nil, "", fmt.Errorf("%w: --jwt-jwks-ca: %v", errUsage, err)
			}
		}
	default:
		if acfg.JWKS, err = os.ReadFile(cfg.jwtJWKSFile); err != nil {
			return nil, "", fmt.Errorf("%w: --jwt-jwks-file: %v", errUsage, err)
		}
	}
	a, err := auth.New(acfg)
	if err != nil {
		return nil, "", fmt.Errorf("%w: --auth jwt: %v", errUsage, err)
	}
	if cfg.jwtAudience == "" {
		log.Warn("--jwt-audience is empty: tokens issued for other services are accepted too")
	}
	mode := "jwt (" + strings.Join(a.Algorithms(), ", ") + ")"
	if cfg.jwtJWKSURL != "" {
		mode = "jwt (JWK Set of " + cfg.jwtJWKSURL + ": " + strings.Join(a.Algorithms(), ", ") + ")"
	}
	return a, mode, nil
}

// tokensOf returns the conversation.Config.Tokens of a: nil for nil.
func tokensOf(a *auth.Authenticator, log *slog.Logger, ledger *ledger.Ledger) conversation.Tokens {
	if a == nil {
		return nil
	}
	return jwtTokens{a: a, log: log, ledger: ledger}
}

// principalOf returns the principal of a request as the endpoints without sockets need it:
// the subject of its token, or nil (every client is one principal) without tokens.
func principalOf(t conversation.Tokens) func(*http.Request) (string, error) {
	if t == nil {
		return nil
	}
	return func(r *http.Request) (string, error) {
		p, _, err := t.Identify(r)
		return p, err
	}
}

// jwtTokens is conversation.Tokens over an Authenticator. Refused handshakes are logged at
// debug level, with the reason and never the token (the socket answers refused auth frames).
//
// Every token verified sets its principal's token budget in the ledger: its
// auth.BudgetClaim until it expires, else --token-budget.
type jwtTokens struct {
	a      *auth.Authenticator
	log    *slog.Logger
	ledger *ledger.Ledger // nil: no ledger
}

func (j jwtTokens) Identify(r *http.Request) (string, time.Time, error) {
	id, err := j.a.Identify(r)
	if err != nil {
		j.log.Debug("handshake refused", keyRemote, r.RemoteAddr, keyErr, err.Error())
	}
	return j.budgeted(id, err)
}

func (j jwtTokens) Verify(token string) (string, time.Time, error) {
	return j.budgeted(j.a.VerifyIdentity(token))
}

// budgeted gives a verified identity's budget to the ledger, and returns what Identify does.
func (j jwtTokens) budgeted(id auth.Identity, err error) (string, time.Time, error) {
	switch {
	case err != nil:
	case id.TokenBudget >= 0:
		j.ledger.SetBudget(id.Subject, id.TokenBudget, id.Expires)
	default:
		j.ledger.ClearBudget(id.Subject)
	}
	return id.Subject, id.Expires, err
}

// certPool returns the system's roots plus the certificates of the PEM file at path.
func certPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}

// newTLSConfig loads --tls-cert and --tls-key; nil without them.
func newTLSConfig(cfg serveConfig) (*tls.Config, error) {
	if cfg.tlsCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("%w: --tls-cert/--tls-key: %v", errUsage, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// runLimits returns the per-run limits of the flags.
func runLimits(cfg serveConfig) turn.Limits {
	return turn.Limits{MaxEvents: cfg.maxRunEvents, MaxBytes: cfg.maxRunBytes, MaxEventBytes: int(cfg.maxEventBytes),
		IdleTimeout: cfg.agentIdleTimeout}
}

// logOrigins warns about an origin pattern that lets every page in.
func logOrigins(cfg serveConfig, log *slog.Logger) {
	for _, p := range cfg.allowedOrigins {
		if p == "*" || strings.HasSuffix(p, "://*") {
			log.Warn("--allowed-origins lets pages of any site open sockets with the browser's cookies", keyOrigins, strings.Join(cfg.allowedOrigins, ","))
			return
		}
	}
}

// principalLimits returns the conversation bounds of --principal-limit, by subject.
func principalLimits(cfg serveConfig) map[string]conversation.PrincipalLimits {
	out := make(map[string]conversation.PrincipalLimits, len(cfg.principalLimits))
	for sub, l := range cfg.principalLimits {
		out[sub] = conversation.PrincipalLimits{Sockets: l.sockets, Turns: l.turns, TurnRate: l.turnRate, TurnBurst: l.turnBurst, Hydrates: l.hydrates}
	}
	return out
}

// principalReaders returns the Durable Streams reads of --principal-limit, by subject.
func principalReaders(cfg serveConfig) map[string]int {
	out := map[string]int{}
	for sub, l := range cfg.principalLimits {
		if l.readers > 0 {
			out[sub] = l.readers
		}
	}
	return out
}
