package durable_test

import (
	"context"
	"log"
	"net/http"

	"github.com/wsgateway/wsgateway/durable"
	"github.com/wsgateway/wsgateway/jetstream"
)

// The protocol served beside the run logs, on the store's NATS connection.
func Example() {
	ctx := context.Background()
	store, err := jetstream.Open(ctx, jetstream.Config{DataDir: "./data"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	h, err := durable.New(ctx, durable.Config{Conn: store.Conn(), JetStream: store.JetStream()})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	for _, p := range h.Patterns() {
		mux.Handle(p, h)
	}
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	srv.RegisterOnShutdown(h.Close)
	log.Fatal(srv.ListenAndServe())
}
