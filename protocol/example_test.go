package protocol_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/wsgateway/wsgateway/protocol"
)

func ExamplePipeline() {
	p := protocol.NewPipeline(protocol.PipelineOptions{})
	for _, line := range []string{
		`{"type":"RUN_STARTED","threadId":"t1","runId":"r1"}`,
		`{"type":"TEXT_MESSAGE_CHUNK","messageId":"m1","delta":"Hello"}`,
		`{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}`,
	} {
		events, err := p.Push([]byte(line))
		if err != nil {
			fmt.Println("violation:", err)
			return
		}
		for _, e := range events {
			fmt.Println(string(e.JSON()))
		}
	}
	fmt.Println("terminated:", p.Terminated())
	// Output:
	// {"type":"RUN_STARTED","threadId":"t1","runId":"r1"}
	// {"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}
	// {"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hello"}
	// {"type":"TEXT_MESSAGE_END","messageId":"m1"}
	// {"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}
	// terminated: true
}

func ExampleDecodeEvent() {
	_, err := protocol.DecodeEvent([]byte(`{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"tool"}`))
	fmt.Println(err)
	// Output:
	// role: Invalid option: expected one of "developer"|"system"|"assistant"|"user"
}

func ExampleVerifyStream() {
	in := strings.NewReader(`{"type":"RUN_STARTED","threadId":"t1","runId":"r1"}
{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"x"}
`)
	err := protocol.VerifyStream(in, os.Stdout, protocol.PipelineOptions{})
	fmt.Println(err)
	// Output:
	// {"type":"RUN_STARTED","threadId":"t1","runId":"r1"}
	// line 2: Cannot send 'TEXT_MESSAGE_CONTENT' event: No active text message found with ID 'm1'. Start a text message with 'TEXT_MESSAGE_START' first.
}

func ExampleDecodeClientFrame() {
	for _, frame := range []string{
		`{"type":"abort","runId":"r1"}`,
		`{"threadId":"t1","runId":"r2","messages":[{"id":"u1","role":"user","content":"hi"}]}`,
		`{"threadId":"t1","runId":"r3","messages":[{"id":"u1","role":"robot"}]}`,
	} {
		f, err := protocol.DecodeClientFrame([]byte(frame))
		switch {
		case err != nil:
			fmt.Println(string(protocol.AppendRunError(nil, err.Error(), "invalid_input")))
		case f.Kind == protocol.FrameAbort:
			fmt.Println("abort", f.RunID)
		default:
			fmt.Println("run", f.RunID, f.Input.LastUserText())
		}
	}
	// Output:
	// abort r1
	// run r2 hi
	// {"type":"RUN_ERROR","message":"messages[0].role: must be one of developer, system, assistant, user, tool, activity, reasoning","code":"invalid_input"}
}
