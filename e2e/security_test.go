package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

// The bad-input catalogue: hostile handshakes, frames, resume parameters, principals and
// floods against one real gateway process with JWT authentication and small limits. Each case
// states the exact answer (HTTP status, close code, or RUN_ERROR code and message); after each
// one, a control socket opened before the catalogue still serves a turn, and a run of another
// turn (the victim, completed before the catalogue) still holds exactly the log it held.
// Finally every socket is closed and the process's goroutines return to their level before
// the catalogue. TestSlowConsumerClosedAndResumes and TestSecurityHostileUpstream cover a
// client that stops reading and an AG-UI upstream that misbehaves, each on a gateway of its
// own.

// Limits of the catalogue's gateway.
const (
	secReadLimit     = 256 << 10
	secMaxRunEvents  = 200
	secMaxRunBytes   = 128 << 10
	secMaxEventBytes = 64 << 10
	secAgentIdle     = 2 * time.Second
	secAudience      = "wsgateway"
	secIssuer        = "e2e"
	secOrigin        = "app.example.com"
	// secPrincipalSockets is low, so that one principal reaches it in a few sockets.
	secPrincipalSockets = 32
	// secRunFrameBurst covers the control socket's probe after every case
	// (TestSecuritySocketLimits tests the run-frame limits on a gateway of its own).
	secRunFrameBurst = 200
)

// secGateway is the catalogue's gateway and the key that signs its tokens.
type secGateway struct {
	*gateway
	key     *ecdsa.PrivateKey
	pemFile string
}

// newJWTKey returns a P-256 key that signs test tokens and a PEM file of its public key,
// for --jwt-key-file.
func newJWTKey(tb testing.TB) (*ecdsa.PrivateKey, string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		tb.Fatal(err)
	}
	pemFile := filepath.Join(tb.TempDir(), "jwt-public.pem")
	if err := os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return key, pemFile
}

func startSecGateway(tb testing.TB) *secGateway {
	tb.Helper()
	key, pemFile := newJWTKey(tb)
	gw := startGateway(tb,
		"--auth", "jwt", "--jwt-key-file", pemFile, "--jwt-audience", secAudience, "--jwt-issuer", secIssuer,
		"--allowed-origins", secOrigin,
		"--read-limit", strconv.Itoa(secReadLimit),
		"--max-run-events", strconv.Itoa(secMaxRunEvents),
		"--max-run-bytes", strconv.Itoa(secMaxRunBytes),
		"--max-event-bytes", strconv.Itoa(secMaxEventBytes),
		"--agent-idle-timeout", secAgentIdle.String(),
		"--max-principal-sockets", strconv.Itoa(secPrincipalSockets),
		"--run-frame-burst", strconv.Itoa(secRunFrameBurst), "--principal-turn-burst", strconv.Itoa(secRunFrameBurst),
		// The catalogue counts every answer to floods of thousands of requests and frames,
		// which the refusal delay would pace to two a second; the delay has tests of its own
		// (conversation's TestRefusalDelay, TestHostilePrincipalEveryDoor at its default).
		"--refusal-delay", "0")
	return &secGateway{gateway: gw, key: key, pemFile: pemFile}
}

// claimsFor returns valid claims for sub.
func claimsFor(sub string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{"sub": sub, "aud": secAudience, "iss": secIssuer,
		"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(time.Hour).Unix()}
}

// token returns an ES256 token of the gateway's key for sub, with edit applied to its claims.
func (g *secGateway) token(tb testing.TB, sub string, edit func(jwt.MapClaims)) string {
	tb.Helper()
	c := claimsFor(sub)
	if edit != nil {
		edit(c)
	}
	return signToken(tb, jwt.SigningMethodES256, g.key, c)
}

func signToken(tb testing.TB, m jwt.SigningMethod, key any, c jwt.MapClaims) string {
	tb.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		tb.Fatalf("sign %s: %v", m.Alg(), err)
	}
	return s
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

// dialAs opens /ws?query as principal sub, closed when the test ends.
func (g *secGateway) dialAs(tb testing.TB, ctx context.Context, sub, query string) *websocket.Conn {
	tb.Helper()
	u := g.WS
	if query != "" {
		u += "?" + query
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: bearer(g.token(tb, sub, nil))})
	if err != nil {
		tb.Fatalf("dial %s as %s: %v", u, sub, err)
	}
	c.SetReadLimit(1 << 20)
	tb.Cleanup(func() { c.CloseNow() })
	return c
}

// handshakeStatus returns the HTTP status of a /ws handshake: 101 when it became a socket
// (which it closes at once).
func handshakeStatus(ctx context.Context, u string, h http.Header) (int, error) {
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		return resp.StatusCode, nil
	}
	if resp != nil {
		return resp.StatusCode, nil
	}
	return 0, err
}

// runFrameJSON returns a run frame of the demo agent for runID, with one user message per
// text.
func runFrameJSON(tb testing.TB, runID, demoOpts string, texts ...string) []byte {
	tb.Helper()
	msgs := make([]map[string]any, len(texts))
	for i, text := range texts {
		// Ids of this run's own: a message posted again under an id the thread holds is that
		// message (THREADS.md section 5), whatever its content now.
		msgs[i] = map[string]any{"id": fmt.Sprintf("%s-u%d", runID, i), "role": "user", "content": text}
	}
	b, err := json.Marshal(map[string]any{"threadId": "t", "runId": runID, "messages": msgs,
		"forwardedProps": map[string]any{"demo": json.RawMessage(demoOpts)}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// wire is one frame read from a socket: an envelope, a bare event, or the close.
type wire struct {
	Offset  string
	Bare    bool
	Type    string
	Name    string
	Code    string
	Message string
	Delta   string
	Close   websocket.StatusCode // -1 unless the socket closed
	Reason  string
	Raw     string
}

// String is how the catalogue writes answers: "close 1008 invalid offset", "RUN_ERROR
// invalid_input" (bare), "envelope RUN_FINISHED".
func (w wire) String() string {
	switch {
	case w.Close != -1:
		return strings.TrimSpace(fmt.Sprintf("close %d %s", int(w.Close), w.Reason))
	case w.Bare:
		return strings.TrimSpace(w.Type + " " + w.Code)
	}
	return strings.TrimSpace("envelope " + w.Type + " " + w.Code)
}

func (w wire) terminal() bool { return w.Type == "RUN_FINISHED" || w.Type == "RUN_ERROR" }

// readWire reads the next frame that is not a ping.
func readWire(tb testing.TB, ctx context.Context, c *websocket.Conn) wire {
	tb.Helper()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			st := websocket.CloseStatus(err)
			if st == -1 {
				tb.Fatalf("read: %v", err)
			}
			var ce websocket.CloseError
			reason := ""
			if errors.As(err, &ce) {
				reason = ce.Reason
			}
			return wire{Close: st, Reason: reason}
		}
		var f struct {
			ID    string          `json:"id"`
			Chunk json.RawMessage `json:"chunk"`
			Type  string          `json:"type"`
		}
		if err := json.Unmarshal(data, &f); err != nil {
			tb.Fatalf("frame %q is not JSON: %v", data, err)
		}
		if f.Type == "ping" {
			continue
		}
		w := wire{Close: -1, Raw: string(data), Offset: f.ID, Bare: f.Chunk == nil}
		ev := data
		if !w.Bare {
			ev = f.Chunk
		}
		var e struct {
			Type    string `json:"type"`
			Name    string `json:"name"`
			Code    string `json:"code"`
			Message string `json:"message"`
			Delta   string `json:"delta"`
		}
		if err := json.Unmarshal(ev, &e); err != nil {
			tb.Fatalf("event %q: %v", ev, err)
		}
		w.Type, w.Name, w.Code, w.Message, w.Delta = e.Type, e.Name, e.Code, e.Message, e.Delta
		return w
	}
}

// readTurn reads envelopes until a terminal one (or a bare frame, or the close) and returns
// them all.
func readTurn(tb testing.TB, ctx context.Context, c *websocket.Conn) []wire {
	tb.Helper()
	var out []wire
	for {
		w := readWire(tb, ctx, c)
		out = append(out, w)
		if w.Close != -1 || w.Bare || w.terminal() {
			return out
		}
	}
}

// probe sends a short run frame on c and returns what the socket answered before the probe's
// turn began (the answers to the frames sent before it), then reads the probe's turn to its
// end: the socket still serves. A socket that closed instead answers "close <code>".
func probe(tb testing.TB, ctx context.Context, c *websocket.Conn, runID string) []string {
	tb.Helper()
	// A write to a socket the gateway has closed fails or is lost; the read says why.
	c.Write(ctx, websocket.MessageText, runFrameJSON(tb, runID, `{"tokens":1,"intervalMs":0}`, "probe"))
	var answers []string
	for {
		w := readWire(tb, ctx, c)
		if w.Close != -1 {
			return append(answers, fmt.Sprintf("close %d", int(w.Close)))
		}
		if !w.Bare && w.Name == "run.accepted" {
			break
		}
		answers = append(answers, w.String())
	}
	rest := readTurn(tb, ctx, c)
	if last := rest[len(rest)-1]; last.Type != "RUN_FINISHED" {
		tb.Fatalf("probe turn ended with %v, want RUN_FINISHED", last)
	}
	return answers
}

// joinAs reads runID's whole log as sub and returns its envelopes (raw) and the close.
func (g *secGateway) joinAs(tb testing.TB, ctx context.Context, sub, runID, offset string) ([]wire, wire) {
	tb.Helper()
	c := g.dialAs(tb, ctx, sub, "runId="+url.QueryEscape(runID)+"&offset="+url.QueryEscape(offset))
	defer c.CloseNow()
	var evs []wire
	for {
		w := readWire(tb, ctx, c)
		if w.Close != -1 {
			return evs, w
		}
		evs = append(evs, w)
	}
}

// logOf returns runID's complete log as sub: its envelopes, raw.
func (g *secGateway) logOf(tb testing.TB, ctx context.Context, sub, runID string) []wire {
	tb.Helper()
	evs, end := g.joinAs(tb, ctx, sub, runID, "-1")
	if end.Close != websocket.StatusNormalClosure {
		tb.Fatalf("join of %s as %s: %v after %d events, want close 1000", runID, sub, end, len(evs))
	}
	return evs
}

func typesOfWire(ws []wire) string {
	var out []string
	for _, w := range ws {
		s := w.Type
		if w.Type == "RUN_ERROR" {
			s += ":" + w.Code
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

func rawOf(ws []wire) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Raw)
	}
	return strings.Join(out, "\n")
}

// metricValue returns the sum of the samples of a metric on /metrics.
func (g *secGateway) metricValue(tb testing.TB, ctx context.Context, name string) float64 {
	tb.Helper()
	status, body, err := httpGet(ctx, g.URL+"/metrics")
	if err != nil || status != 200 {
		tb.Fatalf("GET /metrics = %d, %v", status, err)
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			tb.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// secCase is one hostile input and its exact answer.
type secCase struct {
	name string
	// run performs the input and returns the answer, which must equal want.
	run  func(t *testing.T, ctx context.Context) string
	want string
}

func TestSecurityCatalogue(t *testing.T) {
	g := startSecGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	baseGoroutines := g.metricValue(t, ctx, "go_goroutines")

	// The victim: alice's completed run, whose log no case may touch.
	victim := g.dialAs(t, ctx, "alice", "")
	if err := victim.Write(ctx, websocket.MessageText, runFrameJSON(t, "victim-run", `{"tokens":3,"intervalMs":0}`, "hello")); err != nil {
		t.Fatal(err)
	}
	readTurn(t, ctx, victim)
	victim.Close(websocket.StatusNormalClosure, "")
	victimLog := g.logOf(t, ctx, "alice", "victim-run")
	if got := typesOfWire(victimLog); !strings.HasSuffix(got, "RUN_FINISHED") {
		t.Fatalf("victim log %s", got)
	}
	victimOffset := victimLog[2].Offset

	// A second run of alice, completed, then resubmitted: its first generation's offsets
	// belong to a recreated log.
	rec := g.dialAs(t, ctx, "alice", "")
	if err := rec.Write(ctx, websocket.MessageText, runFrameJSON(t, "recreated-run", `{"tokens":2,"intervalMs":0}`, "one")); err != nil {
		t.Fatal(err)
	}
	firstGen := readTurn(t, ctx, rec)
	if err := rec.Write(ctx, websocket.MessageText, runFrameJSON(t, "recreated-run", `{"tokens":2,"intervalMs":0}`, "two")); err != nil {
		t.Fatal(err)
	}
	readTurn(t, ctx, rec)
	rec.Close(websocket.StatusNormalClosure, "")
	staleOffset := firstGen[1].Offset

	control := g.dialAs(t, ctx, "carol", "")
	controlTurns := 0

	handshake := func(query string, h http.Header) func(*testing.T, context.Context) string {
		return func(t *testing.T, ctx context.Context) string {
			u := g.WS
			if query != "" {
				u += "?" + query
			}
			status, err := handshakeStatus(ctx, u, h)
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			return strconv.Itoa(status)
		}
	}
	withBearer := func(tok string, kv ...string) http.Header {
		h := bearer(tok)
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	alice := func(edit func(jwt.MapClaims)) string { return g.token(t, "alice", edit) }
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, err := os.ReadFile(g.pemFile)
	if err != nil {
		t.Fatal(err)
	}
	// frames sends frames on a fresh socket of alice, then a probe; the answer is what the
	// socket sent back before the probe's turn ("" for nothing), or its close.
	type frame struct {
		binary bool
		data   []byte
	}
	text := func(s string) frame { return frame{data: []byte(s)} }
	frames := func(fs ...frame) func(*testing.T, context.Context) string {
		return func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, "alice", "")
			for _, f := range fs {
				typ := websocket.MessageText
				if f.binary {
					typ = websocket.MessageBinary
				}
				if err := c.Write(ctx, typ, f.data); err != nil {
					t.Fatalf("write: %v", err)
				}
			}
			return strings.Join(probe(t, ctx, c, fmt.Sprintf("probe-%d", time.Now().UnixNano())), "; ")
		}
	}
	repeat := func(n int, f frame) []frame {
		out := make([]frame, n)
		for i := range out {
			out[i] = f
		}
		return out
	}
	// resume opens a resume socket as sub and returns its close (after any envelopes, which
	// it counts in the answer).
	resume := func(sub, query string) func(*testing.T, context.Context) string {
		return func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, sub, query)
			n := 0
			for {
				w := readWire(t, ctx, c)
				if w.Close != -1 {
					if n > 0 {
						return fmt.Sprintf("%d events, %s", n, w)
					}
					return w.String()
				}
				n++
			}
		}
	}
	// turnEnd runs one run frame as alice and returns the last event of the run's log.
	turnEnd := func(runID string, frame []byte) func(*testing.T, context.Context) string {
		return func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, "alice", "")
			if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
				t.Fatalf("write: %v", err)
			}
			live := readTurn(t, ctx, c)
			log := g.logOf(t, ctx, "alice", runID)
			if rawOf(live) != rawOf(log) {
				t.Errorf("live frames differ from the log:\n%s\nlog:\n%s", rawOf(live), rawOf(log))
			}
			last := log[len(log)-1]
			return last.Type + " " + last.Code + ": " + last.Message
		}
	}
	word := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	var history []string
	for i := 0; i < 1500; i++ {
		history = append(history, fmt.Sprintf("message %d of a long history, padded to some length", i))
	}

	cases := []secCase{
		// Authentication, before the upgrade.
		{"no token", handshake("", nil), "401"},
		{"resume socket without a token", handshake("runId=victim-run&offset=-1", nil), "401"},
		{"expired token", handshake("", bearer(alice(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }))), "401"},
		{"token not valid yet", handshake("", bearer(alice(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }))), "401"},
		{"token without exp", handshake("", bearer(alice(func(c jwt.MapClaims) { delete(c, "exp") }))), "401"},
		{"token signed by another key", handshake("", bearer(signToken(t, jwt.SigningMethodES256, otherKey, claimsFor("alice")))), "401"},
		{"alg none token", handshake("", bearer(signToken(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claimsFor("alice")))), "401"},
		{"HS256 token keyed with the public key", handshake("", bearer(signToken(t, jwt.SigningMethodHS256, pemBytes, claimsFor("alice")))), "401"},
		{"token for another audience", handshake("", bearer(alice(func(c jwt.MapClaims) { c["aud"] = "billing" }))), "401"},
		{"token of another issuer", handshake("", bearer(alice(func(c jwt.MapClaims) { c["iss"] = "evil" }))), "401"},
		{"token without subject", handshake("", bearer(alice(func(c jwt.MapClaims) { delete(c, "sub") }))), "401"},
		{"garbage bearer token", handshake("", bearer("eyJhbGciOiJFUzI1NiJ9.e30.AAAA")), "401"},
		{"basic authorization", handshake("", http.Header{"Authorization": {"Basic YWxpY2U6cGFzcw=="}}), "401"},
		{"token twice in the query", handshake("access_token="+alice(nil)+"&access_token="+alice(nil), nil), "401"},
		{"token in the cookie", handshake("", http.Header{"Cookie": {"wsgateway_token=" + alice(nil)}}), "101"},
		{"token in the query", handshake("access_token="+alice(nil), nil), "101"},
		{"headers of 100 KB", handshake("", withBearer(alice(nil), "X-Pad", word('p', 100<<10))), "431"},
		// Origins.
		{"origin of another site", handshake("", withBearer(alice(nil), "Origin", "https://evil.example")), "403"},
		{"origin of an allowed site", handshake("", withBearer(alice(nil), "Origin", "https://"+secOrigin)), "101"},
		{"origin of the gateway itself", handshake("", withBearer(alice(nil), "Origin", "http://"+g.Addr)), "101"},
		{"origin that is not a URL", handshake("", withBearer(alice(nil), "Origin", "::::")), "403"},

		// Malformed frames on a conversation socket.
		{"not JSON", frames(text("hello there")), ""},
		{"truncated JSON", frames(text(`{"threadId":"t","runId":"x","messages":[`)), ""},
		{"deep nesting", frames(text(`{"threadId":"t","runId":"x","messages":[],"forwardedProps":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`)), ""},
		{"binary frame", frames(frame{binary: true, data: runFrameJSON(t, "binary-run", `{}`, "hi")}), ""},
		{"JSON array", frames(text(`[1,2,3]`)), "RUN_ERROR invalid_input"},
		{"JSON null", frames(text(`null`)), "RUN_ERROR invalid_input"},
		{"empty object", frames(text(`{}`)), "RUN_ERROR invalid_input"},
		{"empty runId", frames(text(`{"threadId":"t","runId":"","messages":[]}`)), "RUN_ERROR invalid_input"},
		{"runId with a NUL", frames(text(`{"threadId":"t","runId":"r\u0000","messages":[]}`)), "RUN_ERROR invalid_input"},
		{"runId with CR LF", frames(text(`{"threadId":"t","runId":"r\r\n","messages":[]}`)), "RUN_ERROR invalid_input"},
		{"runId of 10 KB", frames(text(`{"threadId":"t","runId":"` + word('r', 10<<10) + `","messages":[]}`)), "RUN_ERROR invalid_input"},
		{"messages not an array", frames(text(`{"threadId":"t","runId":"m","messages":"hi"}`)), "RUN_ERROR invalid_input"},
		{"message of an unknown role", frames(text(`{"threadId":"t","runId":"m","messages":[{"id":"u","role":"root","content":"x"}]}`)), "RUN_ERROR invalid_input"},
		{"abort without runId", frames(text(`{"type":"abort"}`)), "RUN_ERROR invalid_input"},
		{"oversized frame", frames(text(`{"pad":"` + word('x', secReadLimit+1) + `"}`)), "close 1009"},
		{"garbage flood", frames(repeat(5000, text("\x00garbage"))...), ""},
		{"binary flood", frames(repeat(2000, frame{binary: true, data: []byte{0, 1, 2}})...), ""},
		{"huge message history", turnEnd("history-run", runFrameJSON(t, "history-run", `{"tokens":1,"intervalMs":0}`, history...)), "RUN_FINISHED : "},

		// Resume parameters.
		{"offset empty", resume("alice", "runId=victim-run&offset="), "close 1008 no resume offset"},
		{"offset whitespace-padded", resume("alice", "runId=victim-run&offset=+"+url.QueryEscape(victimOffset)+"+"), "close 1008 invalid offset"},
		{"offset with CR LF", resume("alice", "runId=victim-run&offset="+url.QueryEscape(victimOffset+"\r\n")), "close 1008 invalid offset"},
		{"offset with NUL", resume("alice", "runId=victim-run&offset="+url.QueryEscape(victimOffset+"\x00")), "close 1008 invalid offset"},
		{"offset negative", resume("alice", "runId=victim-run&offset=-5"), "close 1008 invalid offset"},
		{"offset huge", resume("alice", "runId=victim-run&offset=99999999999999999999999999-1-1-x"), "close 1008 invalid offset"},
		{"offset of 10 KB", resume("alice", "runId=victim-run&offset="+word('1', 10<<10)), "close 1008 invalid offset"},
		{"offset from another run", resume("alice", "runId=recreated-run&offset="+url.QueryEscape(victimOffset)), "close 1008 invalid offset"},
		{"offset from a recreated log", resume("alice", "runId=recreated-run&offset="+url.QueryEscape(staleOffset)), "close 1008 invalid offset"},
		{"runId missing", resume("alice", "offset=-1"), "close 1008 invalid runId"},
		{"runId empty", resume("alice", "runId=&offset=-1"), "close 1008 invalid runId"},
		{"runId with a control character", resume("alice", "runId=victim%00run&offset=-1"), "close 1008 invalid runId"},
		{"runId with CR LF", resume("alice", "runId=victim%0D%0Arun&offset=-1"), "close 1008 invalid runId"},
		{"runId of 10 KB", resume("alice", "runId="+word('r', 10<<10)+"&offset=-1"), "close 1008 invalid runId"},
		{"runId not UTF-8", resume("alice", "runId=%FF%FE&offset=-1"), "close 1008 invalid runId"},
		{"unknown run", resume("alice", "runId=no-such-run&offset=-1"), "close 4404 unknown or expired run"},
		{"unknown run from now", resume("alice", "runId=no-such-run&offset=now"), "close 4404 unknown or expired run"},

		// Another principal.
		{"another principal resumes", resume("bob", "runId=victim-run&offset="+url.QueryEscape(victimOffset)), "close 4404 unknown or expired run"},
		{"another principal joins", resume("bob", "runId=victim-run&offset=-1"), "close 4404 unknown or expired run"},
		{"another principal tails", resume("bob", "runId=victim-run&offset=now"), "close 4404 unknown or expired run"},
		{"another principal resubmits", func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, "bob", "")
			if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, "victim-run", `{"tokens":1}`, "mine now")); err != nil {
				t.Fatal(err)
			}
			w := readWire(t, ctx, c)
			return w.String() + ": " + w.Message
		}, "RUN_ERROR forbidden: run belongs to another principal"},
		{"another principal aborts a running turn", func(t *testing.T, ctx context.Context) string {
			a := g.dialAs(t, ctx, "alice", "")
			if err := a.Write(ctx, websocket.MessageText, runFrameJSON(t, "alice-live", `{"tokens":30,"intervalMs":10}`, "x")); err != nil {
				t.Fatal(err)
			}
			if w := readWire(t, ctx, a); w.Name != "run.accepted" {
				t.Fatalf("first frame %v", w)
			}
			b := g.dialAs(t, ctx, "bob", "")
			for i := 0; i < 10; i++ {
				if err := b.Write(ctx, websocket.MessageText, []byte(`{"type":"abort","runId":"alice-live"}`)); err != nil {
					t.Fatal(err)
				}
			}
			rest := readTurn(t, ctx, a)
			return fmt.Sprintf("%s after %d deltas", rest[len(rest)-1], strings.Count(typesOfWire(rest), "TEXT_MESSAGE_CONTENT"))
		}, "envelope RUN_FINISHED after 30 deltas"},

		// Floods.
		{"abort flood", frames(func() []frame {
			var fs []frame
			for i := 0; i < 10000; i++ {
				fs = append(fs, text(fmt.Sprintf(`{"type":"abort","runId":"flood-%d"}`, i)))
			}
			return fs
		}()...), ""},
		{"abort flood keeps only the latest early aborts", func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, "alice", "")
			for i := 0; i < 100; i++ {
				if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"type":"abort","runId":"early-%d"}`, i))); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, id := range []string{"early-99", "early-0"} {
				if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, id, `{"tokens":2,"intervalMs":0}`, "x")); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					evs, end := g.joinAs(t, ctx, "alice", id, "-1")
					if end.Close == websocket.StatusNormalClosure {
						got = append(got, id+": "+typesOfWire(evs))
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("join %s: %v", id, end)
					}
				}
			}
			return strings.Join(got, "; ")
		}, "early-99: CUSTOM RUN_ERROR:aborted; early-0: CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"},
		{"resubmit storm", func(t *testing.T, ctx context.Context) string {
			c := g.dialAs(t, ctx, "alice", "")
			for i := 0; i < 30; i++ {
				if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, "storm-run", `{"tokens":20,"intervalMs":5}`, fmt.Sprintf("try %d", i))); err != nil {
					t.Fatal(err)
				}
			}
			for { // the live stream of the last submission ends with RUN_FINISHED
				if w := readWire(t, ctx, c); w.Type == "RUN_FINISHED" {
					break
				}
			}
			log := g.logOf(t, ctx, "alice", "storm-run")
			return fmt.Sprintf("%s, %d deltas", log[len(log)-1], strings.Count(typesOfWire(log), "TEXT_MESSAGE_CONTENT"))
		}, "envelope RUN_FINISHED, 20 deltas"},
		{"thousands of sockets from one principal", func(t *testing.T, ctx context.Context) string {
			dial := func(sub string) (*websocket.Conn, int, string) {
				c, resp, err := websocket.Dial(ctx, g.WS, &websocket.DialOptions{HTTPHeader: bearer(g.token(t, sub, nil))})
				if err == nil {
					return c, resp.StatusCode, ""
				}
				if resp == nil {
					t.Fatalf("dial as %s: %v", sub, err)
				}
				b, _ := io.ReadAll(resp.Body)
				return nil, resp.StatusCode, strings.TrimSpace(string(b))
			}
			var held []*websocket.Conn
			defer func() {
				for _, c := range held {
					c.CloseNow()
				}
			}()
			refused := map[string]int{}
			for i := 0; i < 2000; i++ {
				c, status, body := dial("mallory")
				if c != nil {
					held = append(held, c)
					continue
				}
				refused[fmt.Sprintf("%d %s", status, body)]++
			}
			answer := fmt.Sprintf("%d open, refused %v", len(held), refused)
			other, status, _ := dial("trent")
			answer += fmt.Sprintf("; another principal %d", status)
			if other != nil {
				other.Close(websocket.StatusNormalClosure, "")
			}
			// Closing one frees its slot (the gateway notices the close at once).
			held[0].Close(websocket.StatusNormalClosure, "")
			held = held[1:]
			deadline := time.Now().Add(10 * time.Second)
			for {
				c, status, _ := dial("mallory")
				if c != nil {
					held = append(held, c)
					return answer + fmt.Sprintf("; after a close %d", status)
				}
				if time.Now().After(deadline) {
					return answer + fmt.Sprintf("; after a close still %d", status)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}, fmt.Sprintf("%d open, refused map[429 too many sockets for this principal (max-principal-sockets):%d]; another principal 101; after a close 101",
			secPrincipalSockets, 2000-secPrincipalSockets)},

		// Per-run limits.
		{"run over max-run-events", turnEnd("events-run", runFrameJSON(t, "events-run", `{"tokens":1000,"intervalMs":0}`, "x")),
			fmt.Sprintf("RUN_ERROR limit_exceeded: the run exceeds its limit of %d events (max-run-events)", secMaxRunEvents)},
		{"event over max-event-bytes", turnEnd("event-bytes-run", runFrameJSON(t, "event-bytes-run", `{"intervalMs":0}`, word('w', 100_000))),
			fmt.Sprintf("RUN_ERROR limit_exceeded: an event of %d bytes exceeds the limit of %d bytes per event (max-event-bytes)", len(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"event-bytes-run.msg1","delta":" `)+100_000+2, secMaxEventBytes)},
		{"run over max-run-bytes", turnEnd("run-bytes-run", runFrameJSON(t, "run-bytes-run", `{"intervalMs":0}`, word('a', 50_000)+" "+word('b', 50_000)+" "+word('c', 50_000))),
			fmt.Sprintf("RUN_ERROR limit_exceeded: the run exceeds its limit of %d bytes of events (max-run-bytes)", secMaxRunBytes)},
		{"agent silent past agent-idle-timeout", turnEnd("silent-run", runFrameJSON(t, "silent-run", `{"tokens":3,"intervalMs":60000}`, "x")),
			fmt.Sprintf("RUN_ERROR limit_exceeded: the agent emitted no event for %v (agent-idle-timeout)", secAgentIdle)},
	}
	if len(cases) < 40 {
		t.Fatalf("the catalogue holds %d cases, want at least 40", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
			defer ccancel()
			if got := tc.run(t, cctx); got != tc.want {
				t.Errorf("answer = %q, want %q", got, tc.want)
			}
			// The gateway still serves the control socket, and the victim's log is intact.
			controlTurns++
			if got := probe(t, cctx, control, fmt.Sprintf("control-%d", controlTurns)); len(got) != 0 {
				t.Errorf("control socket answered %q before its turn", got)
			}
			if got := g.logOf(t, cctx, "alice", "victim-run"); rawOf(got) != rawOf(victimLog) {
				t.Errorf("victim log changed:\n%s\nwas:\n%s", rawOf(got), rawOf(victimLog))
			}
		})
	}

	// Every socket closed, the process is back to its goroutines before the catalogue. A
	// resume's consumer that the embedded NATS server still holds (three goroutines each)
	// goes at the latest after its inactivity threshold: the wait covers it.
	control.Close(websocket.StatusNormalClosure, "")
	start := time.Now()
	deadline := start.Add(150 * time.Second)
	for {
		open := g.metricValue(t, ctx, "wsgateway_conversation_open_sockets")
		n := g.metricValue(t, ctx, "go_goroutines")
		if open == 0 && n <= baseGoroutines+2 {
			t.Logf("goroutines: %v before the catalogue, %v after %v", baseGoroutines, n, time.Since(start).Round(time.Second))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the catalogue: %v open sockets, %v goroutines (%v before): a leak", open, n, baseGoroutines)
		}
		time.Sleep(time.Second)
	}
}

// TestSecuritySocketLimits: the per-socket limits on a gateway of their own (so that the
// catalogue's control socket keeps its bucket): more turns than --max-socket-turns on one
// socket, and a run-frame flood beyond --run-frame-burst at a --run-frame-rate that refills
// nothing during the test. Each refusal is a bare RUN_ERROR limit_exceeded naming its limit,
// and the socket goes on serving its turns.
func TestSecuritySocketLimits(t *testing.T) {
	const maxTurns, burst = 2, 5
	gw := startGateway(t, "--max-socket-turns", strconv.Itoa(maxTurns), "--run-frame-rate", "0.01", "--run-frame-burst", strconv.Itoa(burst),
		"--refusal-delay", "0") // as the catalogue's

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(t *testing.T, query string) *websocket.Conn {
		u := gw.WS
		if query != "" {
			u += "?" + query
		}
		c, _, err := websocket.Dial(ctx, u, nil)
		if err != nil {
			t.Fatalf("dial %s: %v", u, err)
		}
		c.SetReadLimit(1 << 20)
		t.Cleanup(func() { c.CloseNow() })
		return c
	}
	send := func(t *testing.T, c *websocket.Conn, runID, opts string) {
		if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, runID, opts, "hi")); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	// Turns of 2 s: the frames after them arrive while they run.
	const slow = `{"tokens":2,"intervalMs":1000}`
	// answers reads until finished turns ended with RUN_FINISHED, and counts the bare
	// answers by code and message, the turns accepted and finished.
	answers := func(t *testing.T, c *websocket.Conn, finished int) string {
		bare := map[string]int{}
		accepted, done := 0, 0
		for done < finished {
			w := readWire(t, ctx, c)
			switch {
			case w.Close != -1:
				t.Fatalf("socket closed: %v", w)
			case w.Bare:
				bare[w.Code+": "+w.Message]++
			case w.Name == "run.accepted":
				accepted++
			case w.Type == "RUN_FINISHED":
				done++
			case w.Type == "RUN_ERROR":
				t.Fatalf("a turn ended with %v: %s", w, w.Message)
			}
		}
		return fmt.Sprintf("%d accepted, %d finished, refused %v", accepted, done, bare)
	}
	cases := []secCase{
		{"more turns than allowed on one socket", func(t *testing.T, ctx context.Context) string {
			c := dial(t, "")
			send(t, c, "turns-a", slow)
			send(t, c, "turns-b", slow)
			for started := 0; started < maxTurns; {
				if w := readWire(t, ctx, c); w.Name == "run.accepted" {
					started++
				} else if w.Close != -1 || w.Bare || w.terminal() {
					t.Fatalf("before both turns started: %v", w)
				}
			}
			send(t, c, "turns-c", slow)                          // a third turn while two run
			send(t, c, "turns-a", `{"tokens":1,"intervalMs":0}`) // a resubmit is no new turn
			answer := answers(t, c, 2)
			// The refused turn has no log.
			r := dial(t, "runId=turns-c&offset=-1")
			return answer + "; resume of the refused run: " + readWire(t, ctx, r).String()
		}, "1 accepted, 2 finished, refused map[limit_exceeded: max-socket-turns: too many turns running on this socket:1]; resume of the refused run: close 4404 unknown or expired run"},
		{"run-frame flood", func(t *testing.T, ctx context.Context) string {
			c := dial(t, "")
			for i := 0; i < 500; i++ {
				send(t, c, fmt.Sprintf("flood-%d", i), slow)
			}
			// The two turns accepted still stream to their end on the flooded socket.
			return answers(t, c, maxTurns)
		}, fmt.Sprintf("%d accepted, %d finished, refused map[limit_exceeded: max-socket-turns: too many turns running on this socket:%d limit_exceeded: run-frame-rate: too many run frames per second on this socket:%d]",
			maxTurns, maxTurns, burst-maxTurns, 500-burst)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.run(t, ctx); got != tc.want {
				t.Errorf("answer = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSlowConsumerClosedAndResumes: a client that stops reading while a long turn streams is
// closed 1013 "slow consumer" once its queue overflows (the turn goes on into its log); it
// resumes from the last offset it received and gets exactly the rest: every delta once, in
// order.
func TestSlowConsumerClosedAndResumes(t *testing.T) {
	gw := startGateway(t, "--socket-queue-frames", "64", "--socket-queue-bytes", "64KiB")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A small receive buffer, so that the gateway's writes block soon after the client stops
	// reading.
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10)
		})
		return errors.Join(err, serr)
	}}
	tr := &http.Transport{DialContext: dialer.DialContext}
	defer tr.CloseIdleConnections()
	c, _, err := websocket.Dial(ctx, gw.WS, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	const tokens = 50_000 // under the default --max-run-events
	if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, "slow-run", fmt.Sprintf(`{"tokens":%d,"intervalMs":0}`, tokens), "x")); err != nil {
		t.Fatal(err)
	}
	var deltas strings.Builder
	last := ""
	w := readWire(t, ctx, c) // run.accepted
	last = w.Offset
	// Stop reading until the gateway reports the overflow.
	for len(gw.logRecords("slow consumer")) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the gateway never closed the slow client")
		case <-time.After(50 * time.Millisecond):
		}
	}
	var end wire
	for {
		w := readWire(t, ctx, c)
		if w.Close != -1 {
			end = w
			break
		}
		deltas.WriteString(w.Delta)
		last = w.Offset
	}
	if end.String() != "close 1013 slow consumer" {
		t.Fatalf("slow client closed %v, want close 1013 slow consumer", end)
	}
	live := deltas.Len()

	r, _, err := websocket.Dial(ctx, gw.WS+"?runId=slow-run&offset="+url.QueryEscape(last), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.CloseNow()
	r.SetReadLimit(1 << 20)
	for {
		w := readWire(t, ctx, r)
		if w.Close != -1 {
			if w.Close != websocket.StatusNormalClosure {
				t.Fatalf("resume closed %v, want 1000", w)
			}
			break
		}
		deltas.WriteString(w.Delta)
	}
	var want strings.Builder
	for i := 1; i <= tokens; i++ {
		fmt.Fprintf(&want, "t%d ", i)
	}
	if deltas.String() != want.String() {
		got, w := deltas.String(), want.String()
		i := 0
		for i < len(got) && i < len(w) && got[i] == w[i] {
			i++
		}
		t.Errorf("first difference at byte %d (live part %d bytes): got %q, want %q", i, live, got[max(0, i-30):min(len(got), i+30)], w[max(0, i-30):min(len(w), i+30)])
		t.Fatalf("deltas received live and on resume (%d bytes) differ from t1..t%d (%d bytes)", deltas.Len(), tokens, want.Len())
	}
	t.Logf("%d bytes of deltas live before 1013, %d on resume", live, deltas.Len()-live)
}

// TestSecurityHostileUpstream: an AG-UI upstream (--agent agui) that sends garbage, a 100 MB
// event, nothing at all, or nothing after its first event, or fails. Each turn ends with
// RUN_ERROR code agent_error in its log and live; the 100 MB event is not read to its end;
// and the gateway goes on serving a well-behaved turn after each.
func TestSecurityHostileUpstream(t *testing.T) {
	var mu sync.Mutex
	written := map[string]int{} // bytes the upstream managed to send, per runId
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			ThreadID string `json:"threadId"`
			RunID    string `json:"runId"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if strings.HasPrefix(in.RunID, "status-") {
			http.Error(w, "upstream exploded", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		send := func(s string) bool {
			n, err := io.WriteString(w, s)
			mu.Lock()
			written[in.RunID] += n
			mu.Unlock()
			return err == nil && rc.Flush() == nil
		}
		started := fmt.Sprintf(`data: {"type":"RUN_STARTED","threadId":%q,"runId":%q}`+"\n\n", in.ThreadID, in.RunID)
		switch {
		case strings.HasPrefix(in.RunID, "good-"):
			send(started + `data: {"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}` + "\n\n" +
				`data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"fine"}` + "\n\n" +
				`data: {"type":"TEXT_MESSAGE_END","messageId":"m"}` + "\n\n" +
				fmt.Sprintf(`data: {"type":"RUN_FINISHED","threadId":%q,"runId":%q}`+"\n\n", in.ThreadID, in.RunID))
		case strings.HasPrefix(in.RunID, "garbage-"):
			send(started + "data: \x00\xff not an event\n\n")
			<-r.Context().Done()
		case strings.HasPrefix(in.RunID, "huge-"):
			if !send(started + `data: {"type":"CUSTOM","name":"x","value":"`) {
				return
			}
			chunk := strings.Repeat("x", 64<<10)
			for i := 0; i < (100<<20)/len(chunk); i++ {
				if !send(chunk) {
					return
				}
			}
			send("\"}\n\n")
			<-r.Context().Done()
		case strings.HasPrefix(in.RunID, "silent-after-"):
			send(started)
			<-r.Context().Done()
		case strings.HasPrefix(in.RunID, "silent-"):
			rc.Flush()
			<-r.Context().Done()
		}
	}))
	up.Start()
	defer up.Close()

	gw := startGateway(t, "--agent", "agui", "--agent-url", up.URL+"/agent",
		"--agent-first-event-timeout", "1s", "--agent-gap-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runTurn := func(runID string) (live []wire) {
		t.Helper()
		c, _, err := websocket.Dial(ctx, gw.WS, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		if err := c.Write(ctx, websocket.MessageText, runFrameJSON(t, runID, `{}`, "hi")); err != nil {
			t.Fatal(err)
		}
		return readTurn(t, ctx, c)
	}
	tests := []struct {
		runID string
		want  string // event types of the turn, live
	}{
		{"garbage-1", "CUSTOM RUN_STARTED RUN_ERROR:agent_error"},
		{"huge-1", "CUSTOM RUN_STARTED RUN_ERROR:agent_error"},
		{"silent-1", "CUSTOM RUN_ERROR:agent_error"},
		{"silent-after-1", "CUSTOM RUN_STARTED RUN_ERROR:agent_error"},
		{"status-1", "CUSTOM RUN_ERROR:agent_error"},
	}
	for i, tt := range tests {
		t.Run(tt.runID, func(t *testing.T) {
			live := runTurn(tt.runID)
			if got := typesOfWire(live); got != tt.want {
				t.Errorf("turn %s = %s, want %s", tt.runID, got, tt.want)
			}
			var logged []string
			for _, e := range joinLog(t, ctx, gw, tt.runID) {
				s, _ := e["type"].(string)
				if code, ok := e["code"].(string); ok {
					s += ":" + code
				}
				logged = append(logged, s)
			}
			if got := strings.Join(logged, " "); got != tt.want {
				t.Errorf("log of %s = %s, want %s", tt.runID, got, tt.want)
			}
			if good := runTurn(fmt.Sprintf("good-%d", i)); typesOfWire(good) != "CUSTOM RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED" {
				t.Errorf("a good turn after %s = %s", tt.runID, typesOfWire(good))
			}
		})
	}
	mu.Lock()
	huge := written["huge-1"]
	mu.Unlock()
	if huge >= 100<<20 {
		t.Errorf("the upstream sent all of its 100 MB event (%d bytes): the gateway read it to its end", huge)
	}
	t.Logf("the upstream sent %d bytes of the 100 MB event before the gateway hung up", huge)
}
