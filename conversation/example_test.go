package conversation_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/jetstream"
)

// The wiring of GET /ws and the HTTP transports: a run log store, an agent, the socket server, and a graceful
// shutdown that drains running turns for ten seconds.
func Example() {
	ctx := context.Background()
	store, err := jetstream.Open(ctx, jetstream.Config{DataDir: "./data"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	srv, err := conversation.New(conversation.Config{
		Store:     conversation.RunStore(store),
		Agent:     testAgent{},
		Heartbeat: heartbeat.Config{Interval: 30 * time.Second, IdleTimeout: 5 * time.Minute},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ws", srv)
	// The HTTP transports of the same turns (PROTOCOL.md section 5).
	for path, framing := range map[string]conversation.Framing{"/api/chat": conversation.SSE, "/api/chat/ndjson": conversation.NDJSON} {
		mux.Handle("POST "+path, srv.HTTPHandler(framing))
		mux.Handle("GET "+path, srv.HTTPHandler(framing))
	}
	hs := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	go hs.ListenAndServe()

	// On SIGTERM: stop accepting, close sockets 1012, drain turns.
	drain, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	hs.Shutdown(drain)
	srv.Shutdown(drain)
}
