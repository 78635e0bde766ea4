package openai

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wsgateway/wsgateway/protocol"
)

// chatRequest is the body of a streamed Chat Completions request.
type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	Tools         []chatTool    `json:"tools,omitempty"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"` // a string, an array of parts, or nil
	Name       string         `json:"name,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string           `json:"type"`
	Function chatToolFunction `json:"function"`
}

type chatToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

type chatPart struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	ImageURL   *chatImageURL   `json:"image_url,omitempty"`
	InputAudio *chatInputAudio `json:"input_audio,omitempty"`
}

type chatImageURL struct {
	URL string `json:"url"`
}

type chatInputAudio struct {
	Data   string `json:"data"`
	Format string `json:"format"`
}

// aguiMessage is the part of an AG-UI message the request needs.
type aguiMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCallID string          `json:"toolCallId"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"toolCalls"`
}

// aguiPart is an AG-UI content part (text, image, audio, video, document).
type aguiPart struct {
	Type   string `json:"type"`
	Text   string `json:"text"`
	Source struct {
		Type     string `json:"type"` // data, url or file
		Value    string `json:"value"`
		MimeType string `json:"mimeType"`
	} `json:"source"`
}

// emptyParameters is the JSON schema of a tool that declares no parameters.
var emptyParameters = json.RawMessage(`{"type":"object","properties":{}}`)

// Request returns the body of the streamed Chat Completions request for in:
//
//   - the context entries, if any, as a first system message ("Context:" then one
//     "- <description>: <value>" line each);
//   - system and developer messages as system messages; user messages with their text, image
//     parts (image_url: the URL, or a data: URL of inline data) and inline wav or mp3 audio
//     (input_audio); assistant messages with their text and tool calls; tool messages with
//     their tool_call_id and text. Activity and reasoning messages, and parts the API cannot
//     take (video, documents, file references), are left out;
//   - the tools as functions (parameters {"type":"object","properties":{}} when absent);
//   - stream true with include_usage.
func Request(model string, in *protocol.RunAgentInput) ([]byte, error) {
	req := chatRequest{
		Model:         model,
		Messages:      []chatMessage{},
		Stream:        true,
		StreamOptions: streamOptions{IncludeUsage: true},
	}
	if len(in.Context) > 0 {
		var b strings.Builder
		b.WriteString("Context:")
		for _, c := range in.Context {
			fmt.Fprintf(&b, "\n- %s: %s", c.Description, c.Value)
		}
		req.Messages = append(req.Messages, chatMessage{Role: "system", Content: b.String()})
	}
	for i, m := range in.Messages {
		var am aguiMessage
		if err := json.Unmarshal(m.Raw, &am); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		cm := chatMessage{Role: m.Role, Name: am.Name}
		switch m.Role {
		case "system", "developer":
			cm.Role = "system"
			cm.Content = m.Text()
		case "user":
			cm.Content = userContent(am.Content, m.Text())
		case "assistant":
			if text := m.Text(); text != "" || len(am.ToolCalls) == 0 {
				cm.Content = text
			}
			for _, tc := range am.ToolCalls {
				cm.ToolCalls = append(cm.ToolCalls, chatToolCall{
					ID: tc.ID, Type: "function",
					Function: chatFunction{Name: tc.Function.Name, Arguments: tc.Function.Arguments},
				})
			}
		case "tool":
			cm.Name = ""
			cm.ToolCallID = m.ToolCallID
			cm.Content = m.Text()
		default: // activity, reasoning: the model does not take them back
			continue
		}
		req.Messages = append(req.Messages, cm)
	}
	for _, t := range in.Tools {
		params := t.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = emptyParameters
		}
		req.Tools = append(req.Tools, chatTool{Type: "function", Function: chatToolFunction{
			Name: t.Name, Description: t.Description, Parameters: params,
		}})
	}
	return json.Marshal(req)
}

// userContent returns a user message's content: its text when it has no part the API takes
// besides text, else the parts.
func userContent(raw json.RawMessage, text string) any {
	var parts []aguiPart
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &parts) != nil {
		return text
	}
	var out []chatPart
	media := false
	for _, p := range parts {
		switch p.Type {
		case "text":
			out = append(out, chatPart{Type: "text", Text: p.Text})
		case "image":
			u := p.Source.Value
			switch p.Source.Type {
			case "data":
				u = "data:" + p.Source.MimeType + ";base64," + p.Source.Value
			case "url":
			default:
				continue
			}
			out = append(out, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: u}})
			media = true
		case "audio":
			format := map[string]string{"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}[p.Source.MimeType]
			if p.Source.Type != "data" || format == "" {
				continue
			}
			out = append(out, chatPart{Type: "input_audio", InputAudio: &chatInputAudio{Data: p.Source.Value, Format: format}})
			media = true
		}
	}
	if !media {
		return text
	}
	return out
}
