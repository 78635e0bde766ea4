package sse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// upstream starts a loopback HTTP server with h, closed when the test ends. The request body
// is read before h runs, as a real server does: only then does the server notice a client
// that went away (the request's context).
func upstream(tb testing.TB, h http.HandlerFunc) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// streamHeader starts an event stream answer.
func streamHeader(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

func send(w http.ResponseWriter, s string) {
	io.WriteString(w, s)
	w.(http.Flusher).Flush()
}

// collect runs Stream against url and returns the data of the events and Stream's error.
func collect(tb testing.TB, ctx context.Context, url string, lim Limits, redact func(string) string) ([]string, error) {
	tb.Helper()
	client := NewClient(time.Second)
	tb.Cleanup(client.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	if err != nil {
		tb.Fatal(err)
	}
	var got []string
	err = Stream(ctx, client, req, lim, redact, func(ev Event) error {
		got = append(got, ev.Data)
		return nil
	})
	return got, err
}

func TestStreamEvents(t *testing.T) {
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" {
			http.Error(w, "want Accept: text/event-stream, got "+r.Header.Get("Accept"), http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		send(w, "data: 1\n\n: comment\n\ndata: 2\r\n\r\n")
		send(w, "data: 3\n")
		send(w, "\n")
	})
	got, err := collect(t, context.Background(), srv.URL, Limits{}, nil)
	if err != nil || strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("Stream = %q, %v; want [1 2 3], nil", got, err)
	}
}

// TestStreamFailures checks the error of every way an upstream fails, and that the error
// names neither the URL nor a redacted secret.
func TestStreamFailures(t *testing.T) {
	long := strings.Repeat("x", 500)
	tests := []struct {
		name     string
		lim      Limits
		handler  http.HandlerFunc
		wantErr  error
		wantText string
		wantData string // events delivered before the failure, comma-separated; "*" any
	}{
		{
			name: "status with body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, `{"error":"model overloaded"}`, http.StatusBadGateway)
			},
			wantText: `the upstream answered 502 Bad Gateway: {"error":"model overloaded"}`,
		},
		{
			name: "status with a long body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, long, http.StatusInternalServerError)
			},
			wantText: "the upstream answered 500 Internal Server Error: " + long[:200] + "…",
		},
		{
			name: "status echoing the secret",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "Incorrect API key provided: sk-secret-123", http.StatusUnauthorized)
			},
			wantText: "the upstream answered 401 Unauthorized: Incorrect API key provided: [redacted]",
		},
		{
			name: "not an event stream",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				io.WriteString(w, "<html>login</html>")
			},
			wantErr:  ErrNotStream,
			wantText: "the upstream did not answer with text/event-stream (text/html): <html>login</html>",
		},
		{
			name: "no answer at all",
			lim:  Limits{FirstEvent: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				<-r.Context().Done()
			},
			wantErr:  ErrFirstEvent,
			wantText: "no event from the upstream within 200ms",
		},
		{
			name: "headers then nothing",
			lim:  Limits{FirstEvent: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				streamHeader(w)
				<-r.Context().Done()
			},
			wantErr: ErrFirstEvent,
		},
		{
			name: "comments are no first event",
			lim:  Limits{FirstEvent: 300 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				streamHeader(w)
				for {
					select {
					case <-r.Context().Done():
						return
					case <-time.After(20 * time.Millisecond):
						send(w, ": ping\n\n")
					}
				}
			},
			wantErr: ErrFirstEvent,
		},
		{
			name: "stalled after an event",
			lim:  Limits{Gap: 200 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				streamHeader(w)
				send(w, "data: 1\n\ndata: 2\n\ndata: 3")
				<-r.Context().Done()
			},
			wantErr:  ErrStalled,
			wantText: "the upstream stream stalled: nothing received for 200ms",
			wantData: "1,2",
		},
		{
			name: "turn time limit",
			lim:  Limits{Turn: 300 * time.Millisecond},
			handler: func(w http.ResponseWriter, r *http.Request) {
				streamHeader(w)
				for i := 0; ; i++ {
					select {
					case <-r.Context().Done():
						return
					case <-time.After(10 * time.Millisecond):
						send(w, "data: x\n\n")
					}
				}
			},
			wantErr:  ErrTurnTimeout,
			wantText: "the turn exceeded its time limit",
			wantData: "*",
		},
		{
			name: "oversized event",
			lim:  Limits{MaxEventBytes: 100},
			handler: func(w http.ResponseWriter, r *http.Request) {
				streamHeader(w)
				send(w, "data: small\n\ndata: "+long+"\n\n")
			},
			wantErr:  ErrTooLarge,
			wantText: "an upstream event is too large: more than 100 bytes",
			wantData: "small",
		},
	}
	redact := func(s string) string { return strings.ReplaceAll(s, "sk-secret-123", "[redacted]") }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, tt.handler)
			got, err := collect(t, context.Background(), srv.URL+"/path?token=sk-secret-123", tt.lim, redact)
			if err == nil {
				t.Fatalf("Stream = %q, nil; want an error", got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Stream error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantText != "" && err.Error() != tt.wantText {
				t.Errorf("Stream error text = %q, want %q", err.Error(), tt.wantText)
			}
			if tt.wantData != "*" && strings.Join(got, ",") != tt.wantData {
				t.Errorf("Stream delivered %q before failing, want %q", got, tt.wantData)
			}
			if strings.Contains(err.Error(), "sk-secret") || strings.Contains(err.Error(), srv.Listener.Addr().String()) {
				t.Errorf("Stream error %q names the secret or the URL", err)
			}
		})
	}
}

// TestStreamKeepAlive: comments after the first event keep a slow stream within its gap.
func TestStreamKeepAlive(t *testing.T) {
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		streamHeader(w)
		send(w, "data: 1\n\n")
		for range 50 { // 1s of comments, 20ms apart
			time.Sleep(20 * time.Millisecond)
			send(w, ":\n")
		}
		send(w, "\ndata: 2\n\n")
	})
	got, err := collect(t, context.Background(), srv.URL, Limits{Gap: 500 * time.Millisecond}, nil)
	if err != nil || strings.Join(got, ",") != "1,2" {
		t.Fatalf("Stream = %q, %v; want [1 2], nil", got, err)
	}
}

// TestStreamCancel: cancelling ctx cancels the upstream request at once, and Stream returns
// ctx's error rather than an upstream failure.
func TestStreamCancel(t *testing.T) {
	gone := make(chan struct{})
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		streamHeader(w)
		send(w, "data: 1\n\n")
		<-r.Context().Done()
		close(gone)
	})
	ctx, cancel := context.WithCancel(context.Background())
	client := NewClient(0)
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	err := Stream(ctx, client, req, Limits{}, nil, func(ev Event) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Stream after cancel = %v, want context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
}

// TestStreamCallbackError: an error of the callback ends the stream and is returned as is.
func TestStreamCallbackError(t *testing.T) {
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		streamHeader(w)
		send(w, "data: 1\n\ndata: 2\n\n")
		<-r.Context().Done()
	})
	stop := errors.New("stop")
	client := NewClient(0)
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	n := 0
	err := Stream(context.Background(), client, req, Limits{}, nil, func(ev Event) error {
		n++
		return stop
	})
	if err != stop || n != 1 {
		t.Errorf("Stream = %v after %d events, want stop after 1", err, n)
	}
}

func TestStreamConnectRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = collect(t, context.Background(), fmt.Sprintf("http://%s/secret-path", addr), Limits{}, nil)
	if !errors.Is(err, ErrConnect) || strings.Contains(err.Error(), "secret-path") {
		t.Errorf("Stream to a closed port = %v, want ErrConnect without the URL", err)
	}
}
