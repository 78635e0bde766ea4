package aguihttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/agent/aguihttp"
	"github.com/wsgateway/wsgateway/protocol"
)

// The agent POSTs the run input to an AG-UI server and emits the events it streams back.
func Example() {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n")
		io.WriteString(w, "data: {\"type\":\"RUN_FINISHED\",\"threadId\":\"t1\",\"runId\":\"r1\"}\n\n")
	}))
	defer server.Close()

	a, err := aguihttp.New(aguihttp.Config{URL: server.URL, Upstream: agent.Upstream{Header: http.Header{"X-Api-Key": {"secret"}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	in, _ := protocol.DecodeRunAgentInput([]byte(`{"threadId":"t1","runId":"r1","messages":[]}`))
	err = a.Run(context.Background(), in, func(event []byte) error {
		fmt.Println(string(event))
		return nil
	})
	fmt.Println("error:", err)
	// Output:
	// {"type":"RUN_STARTED","threadId":"t1","runId":"r1"}
	// {"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}
	// error: <nil>
}
