package openai_test

import (
	"fmt"

	"github.com/wsgateway/wsgateway/agent/openai"
	"github.com/wsgateway/wsgateway/protocol"
)

// Request shows the Chat Completions request a turn becomes.
func ExampleRequest() {
	in, _ := protocol.DecodeRunAgentInput([]byte(`{"threadId":"t1","runId":"r1",
		"messages":[{"id":"u1","role":"user","content":"Weather in Paris?"}],
		"tools":[{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object"}}]}`))
	body, err := openai.Request("llama3.2", in)
	fmt.Println(string(body), err)
	// Output:
	// {"model":"llama3.2","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object"}}}],"stream":true,"stream_options":{"include_usage":true}} <nil>
}
