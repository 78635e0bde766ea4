package auth

import (
	"fmt"
	"net/http"
	"strings"
)

// TokenFromRequest returns the token a request carries: from an "Authorization: Bearer"
// header, else from the cookie named cookie, else from the query parameter named param (an
// empty name skips that source). An Authorization header that is not one Bearer token, a
// query parameter given more than once, and a token longer than MaxTokenLen are refused
// (ErrInvalidToken), never skipped over; no token at all is ErrNoToken.
func TokenFromRequest(r *http.Request, cookie, param string) (string, error) {
	if hs := r.Header.Values("Authorization"); len(hs) > 0 {
		if len(hs) > 1 {
			return "", fmt.Errorf("%w: more than one Authorization header", ErrInvalidToken)
		}
		scheme, tok, ok := strings.Cut(hs[0], " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", fmt.Errorf("%w: the Authorization header is not \"Bearer <token>\"", ErrInvalidToken)
		}
		return checkToken(strings.TrimLeft(tok, " "), "the Authorization header")
	}
	if cookie != "" {
		if c, err := r.Cookie(cookie); err == nil {
			return checkToken(c.Value, "cookie "+cookie)
		}
	}
	if param != "" && r.URL != nil {
		if vs, ok := r.URL.Query()[param]; ok {
			if len(vs) > 1 {
				return "", fmt.Errorf("%w: query parameter %s given %d times", ErrInvalidToken, param, len(vs))
			}
			return checkToken(vs[0], "query parameter "+param)
		}
	}
	return "", ErrNoToken
}

// checkToken refuses an empty or oversized token, or one holding characters no compact JWS
// holds (RFC 7515 section 7.1: base64url parts joined by dots).
func checkToken(tok, source string) (string, error) {
	switch {
	case tok == "":
		return "", fmt.Errorf("%w: %s is empty", ErrInvalidToken, source)
	case len(tok) > MaxTokenLen:
		return "", fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalidToken, source, MaxTokenLen)
	}
	for i := 0; i < len(tok); i++ {
		if !tokenByte(tok[i]) {
			return "", fmt.Errorf("%w: %s holds a byte that no JWT holds at %d", ErrInvalidToken, source, i)
		}
	}
	return tok, nil
}

func tokenByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b == '.'
}
