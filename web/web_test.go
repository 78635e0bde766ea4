package web

import (
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)

	tests := []struct {
		method, path string
		wantStatus   int
		wantType     string // prefix of Content-Type
		wantBody     string // substring of the body
	}{
		{"GET", "/", http.StatusOK, "text/html", `<script type="module" src="app.js"></script>`},
		{"HEAD", "/", http.StatusOK, "text/html", ""},
		{"GET", "/app.js", http.StatusOK, "text/javascript", `from "./conversation.js"`},
		{"GET", "/conversation.js", http.StatusOK, "text/javascript", `"abort"`},
		{"GET", "/render.js", http.StatusOK, "text/javascript", "TEXT_MESSAGE_CONTENT"},
		{"GET", "/style.css", http.StatusOK, "text/css", "prefers-color-scheme: dark"},
		{"GET", "/favicon.svg", http.StatusOK, "image/svg+xml", "<svg"},
		{"GET", "/missing.js", http.StatusNotFound, "text/plain", "404"},
		{"POST", "/", http.StatusMethodNotAllowed, "text/plain", "method not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.wantStatus {
				t.Fatalf("%s %s: status %d, want %d", tt.method, tt.path, res.StatusCode, tt.wantStatus)
			}
			if got := res.Header.Get("Content-Type"); !strings.HasPrefix(got, tt.wantType) {
				t.Errorf("%s %s: Content-Type %q, want prefix %q", tt.method, tt.path, got, tt.wantType)
			}
			if !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("%s %s: body does not contain %q", tt.method, tt.path, tt.wantBody)
			}
			if res.StatusCode == http.StatusOK {
				for key, want := range map[string]string{
					"Cache-Control":           "no-cache",
					"X-Content-Type-Options":  "nosniff",
					"Content-Security-Policy": contentSecurityPolicy,
				} {
					if got := res.Header.Get(key); got != want {
						t.Errorf("%s %s: %s = %q, want %q", tt.method, tt.path, key, got, want)
					}
				}
			}
		})
	}
}

// TestModuleImports checks that every relative import of the page's modules, and every file
// index.html references, is embedded: a missing one would break the page only in a browser.
func TestModuleImports(t *testing.T) {
	page := files()
	refs := map[string]*regexp.Regexp{
		".js":   regexp.MustCompile(`(?m)^\s*import\s[^"]*"\./([^"]+)"`),
		".html": regexp.MustCompile(`(?:src|href)="([^":#]+)"`),
	}
	var checked int
	err := fs.WalkDir(page, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		re, ok := refs[path[strings.LastIndex(path, "."):]]
		if !ok {
			return nil
		}
		text, err := fs.ReadFile(page, path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(text), -1) {
			checked++
			if _, err := fs.Stat(page, m[1]); err != nil {
				t.Errorf("%s refers to %q, which is not embedded", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 5 {
		t.Errorf("checked %d references, want at least 5 (index.html: icon, style, app; app.js: two modules)", checked)
	}
}

// TestListen: a listen on port 0 that is handed a port browsers refuse draws again and closes
// the refused listener; a refused port named in the address is kept.
func TestListen(t *testing.T) {
	refusedAddr := ""
	for _, p := range refusedPorts {
		if p < 1024 {
			continue
		}
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			refusedAddr = ln.Addr().String()
			ln.Close()
			break
		}
	}
	if refusedAddr == "" {
		t.Fatal("every port from 1024 up that browsers refuse is taken on this machine")
	}
	draws := 0
	systemDraws := func(network, addr string) (net.Listener, error) { // a refused port first
		if draws++; draws == 1 {
			return net.Listen(network, refusedAddr)
		}
		return net.Listen(network, addr)
	}
	ln, err := listen("127.0.0.1:0", systemDraws)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if port := ln.Addr().(*net.TCPAddr).Port; RefusedPort(port) || draws != 2 {
		t.Errorf("listen on port 0 returned port %d after %d draws, want a port browsers accept after 2", port, draws)
	}
	again, err := net.Listen("tcp", refusedAddr)
	if err != nil {
		t.Fatalf("the refused listener was left open: %v", err)
	}
	again.Close()

	named, err := Listen(refusedAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	if got := named.Addr().String(); got != refusedAddr {
		t.Errorf("Listen(%s) listens on %s, want the port it was given", refusedAddr, got)
	}
}
