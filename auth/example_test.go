package auth_test

import (
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/wsgateway/wsgateway/auth"
)

func ExampleAuthenticator_Principal() {
	secret := []byte("an HS256 secret of at least 32 bytes")
	a, err := auth.New(auth.Config{Secret: secret, Audience: "wsgateway"})
	if err != nil {
		panic(err)
	}
	tok, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "aud": "wsgateway", "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(secret)

	// Browsers cannot set headers on a WebSocket handshake: the query parameter works too.
	r := httptest.NewRequest("GET", "/ws?access_token="+tok, nil)
	fmt.Println(a.Principal(r))

	r = httptest.NewRequest("GET", "/ws", nil)
	_, err = a.Principal(r) // conversation.Server answers 401 before the upgrade
	fmt.Println(err)
	// Output:
	// alice <nil>
	// auth: no token
}
