package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// Defaults of the JWKS URL fields of Config.
const (
	// DefaultJWKSRefresh is the period of the scheduled fetch of Config.JWKSURL. Providers
	// publish a new key well before they sign with it, and a token of a key not yet fetched
	// triggers a fetch of its own, so the schedule mostly serves to drop removed keys.
	DefaultJWKSRefresh = 15 * time.Minute
	// DefaultJWKSUnknownKID is the least time between two fetches caused by tokens naming
	// an unknown "kid": anyone can send such tokens, so they must not drive the gateway to
	// hammer the provider.
	DefaultJWKSUnknownKID = time.Minute
	// JWKSTimeout bounds one scheduled fetch of the JWK Set, and the first one in New.
	JWKSTimeout = 10 * time.Second
	// jwksUnknownKIDWait bounds how long a token of an unknown "kid" waits for the rate
	// limiter and its fetch: a wait the limiter would make longer is refused at once.
	jwksUnknownKIDWait = 3 * time.Second
)

// jwksAlgorithms are the algorithms a key of a remote JWK Set may verify; each key verifies
// only the one of its type (algorithmOf).
var jwksAlgorithms = []string{jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg(), jwt.SigningMethodES384.Alg()}

// remoteKeys is the key source of Config.JWKSURL: keyfunc over a jwkset HTTP storage, which
// caches the set, fetches it on a schedule and for an unknown "kid" (rate limited), and
// keeps the last good set when a fetch fails.
type remoteKeys struct {
	kf   keyfunc.Keyfunc
	stop context.CancelFunc
}

// newRemoteKeys fetches cfg.JWKSURL once (an error if it fails) and starts the refresh
// goroutine, which runs until close.
func newRemoteKeys(cfg Config) (*remoteKeys, error) {
	u, err := url.Parse(cfg.JWKSURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("the JWK Set URL must be an https:// URL")
	}
	if cfg.JWKSRefresh < 0 || cfg.JWKSUnknownKID < 0 {
		return nil, errors.New("negative JWK Set refresh interval")
	}
	refresh, unknown := cfg.JWKSRefresh, cfg.JWKSUnknownKID
	if refresh == 0 {
		refresh = DefaultJWKSRefresh
	}
	if unknown == 0 {
		unknown = DefaultJWKSUnknownKID
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	failFirst := false
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
		Client:                    jwksClient(cfg.JWKSRootCAs),
		HTTPTimeout:               JWKSTimeout,
		NoErrorReturnFirstHTTPReq: &failFirst,
		RateLimitWaitMax:          jwksUnknownKIDWait,
		RefreshInterval:           refresh,
		RefreshUnknownKID:         rate.NewLimiter(rate.Every(unknown), 1),
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(ctx context.Context, err error) {
				// The last good set stays in use.
				log.Warn("fetching the JWK Set failed; keeping the last one", slog.String("url", u), slog.String("error", err.Error()))
			}
		},
	})
	if err != nil {
		stop()
		return nil, fmt.Errorf("fetching the JWK Set: %w", err)
	}
	// Keys whose "use" is "enc" never verify a signature (RFC 7517 section 4.2).
	kf, err = keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: kf.Storage(), UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
	if err != nil {
		stop()
		return nil, err
	}
	return &remoteKeys{kf: kf, stop: stop}, nil
}

// jwksClient returns the client that fetches the JWK Set: it trusts roots (nil: the
// system's), follows redirects to https:// addresses only, and reads at most maxJWKSLen
// bytes of a response (a longer set fails to decode, and the last good one stays).
func jwksClient(roots *x509.CertPool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{
		Transport: limitedBody{tr},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return errors.New("redirect to a URL that is not https://")
			}
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			return nil
		},
	}
}

// keyFor returns the key (or, for a token without "kid", the keys) of the remote set that
// may verify t: a key verifies only the algorithm of its type, so a token whose "alg" is
// another one is refused before its signature is checked.
func (r *remoteKeys) keyFor(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	k, err := r.kf.Keyfunc(t)
	if err != nil {
		kid, _ := t.Header["kid"].(string)
		if errors.Is(err, jwkset.ErrKeyNotFound) {
			return nil, fmt.Errorf("no key with key id %q in the JWK Set", kid)
		}
		// The limiter refused a fetch for an unknown kid, or the fetch failed.
		return nil, fmt.Errorf("no key with key id %q in the JWK Set, and no fetch of it now (rate limited or failed)", kid)
	}
	if set, ok := k.(jwt.VerificationKeySet); ok {
		var out jwt.VerificationKeySet
		for _, pub := range set.Keys {
			if a, err := algorithmOf(pub); err == nil && a == alg {
				out.Keys = append(out.Keys, pub)
			}
		}
		if len(out.Keys) == 0 {
			return nil, fmt.Errorf("no key for algorithm %s in the JWK Set", alg)
		}
		return out, nil
	}
	a, err := algorithmOf(k)
	if err != nil {
		return nil, err
	}
	if a != alg {
		return nil, fmt.Errorf("the key verifies %s, not %s", a, alg)
	}
	return k, nil
}

func (r *remoteKeys) close() { r.stop() }

// limitedBody cuts the bodies of its responses after maxJWKSLen bytes.
type limitedBody struct{ rt http.RoundTripper }

func (l limitedBody) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(req)
	if err == nil {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, maxJWKSLen), resp.Body}
	}
	return resp, err
}
