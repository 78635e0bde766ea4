package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/wsgateway/wsgateway/auth"
	"github.com/wsgateway/wsgateway/turn"
)

// maxHeaderBytes bounds a request's headers (net/http answers 431 beyond): a handshake needs a
// few hundred bytes, a token at most auth.MaxTokenLen.
const maxHeaderBytes = 64 << 10

// Log attribute keys of the security set-up.
const (
	keyRemote  = "remote"
	keyOrigins = "allowed_origins"
)

// newPrincipal returns the conversation.Config.Principal of --auth and a description of the
// mode for the start line. With --auth none it returns nil (every client is the default
// principal) and logs a warning. Refused handshakes are logged at debug level, with the
// reason and never the token.
func newPrincipal(cfg serveConfig, getenv func(string) (string, bool), log *slog.Logger) (func(*http.Request) (string, error), string, error) {
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
	principal := func(r *http.Request) (string, error) {
		p, err := a.Principal(r)
		if err != nil {
			log.Debug("handshake refused", keyRemote, r.RemoteAddr, keyErr, err.Error())
		}
		return p, err
	}
	return principal, "jwt (" + strings.Join(a.Algorithms(), ", ") + ")", nil
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
