package jetstream_test

import (
	"context"
	"fmt"
	"os"

	"github.com/wsgateway/wsgateway/jetstream"
)

func Example() {
	dir, err := os.MkdirTemp("", "runlog")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	// No URLs: an embedded nats-server stores the log under DataDir.
	store, err := jetstream.Open(ctx, jetstream.Config{DataDir: dir})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	w, err := store.Create(ctx, "alice", "run-1", "thread-1")
	if err != nil {
		panic(err)
	}
	offsets := make(chan string, 2)
	for _, e := range []string{`{"type":"RUN_STARTED"}`, `{"type":"RUN_FINISHED"}`} {
		w.Append([]byte(e), func(offset string, err error) {
			if err != nil {
				panic(err)
			}
			offsets <- offset
		})
	}
	first := <-offsets
	<-offsets
	if err := w.Close(ctx); err != nil {
		panic(err)
	}

	// A client that saw the first event resumes strictly after its offset.
	r, err := store.Read(ctx, "alice", "run-1", first)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	for {
		e, err := r.Next(ctx)
		if err != nil {
			fmt.Println(err) // io.EOF: the log is closed
			break
		}
		fmt.Println(string(e.Event))
	}
	// Output:
	// {"type":"RUN_FINISHED"}
	// EOF
}
