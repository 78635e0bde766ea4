package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/wsgateway/wsgateway/agent/internal/sse"
	"github.com/wsgateway/wsgateway/protocol"
)

// chunk is one streamed chat.completion.chunk (or an error object).
type chunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"` // vLLM, llama.cpp, DeepSeek
			Reasoning        *string `json:"reasoning"`         // Ollama, OpenRouter
			ToolCalls        []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        *int64 `json:"prompt_tokens"`
		CompletionTokens    *int64 `json:"completion_tokens"`
		TotalTokens         *int64 `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		CompletionTokensDetails *struct {
			ReasoningTokens *int64 `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// providerError is the error object of OpenAI and the servers that copy it.
type providerError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    any    `json:"code"`
}

// tokenUsage is an AG-UI TokenUsage.
type tokenUsage struct {
	Model             string `json:"model,omitempty"`
	InputTokens       *int64 `json:"inputTokens,omitempty"`
	OutputTokens      *int64 `json:"outputTokens,omitempty"`
	TotalTokens       *int64 `json:"totalTokens,omitempty"`
	ReasoningTokens   *int64 `json:"reasoningTokens,omitempty"`
	CachedInputTokens *int64 `json:"cachedInputTokens,omitempty"`
}

// toolCall is one tool call of the answer, by its index.
type toolCall struct {
	id      string
	name    string
	started bool
	args    []string // fragments received before the name
}

// converter turns the chunks of one completion into AG-UI events. It is used from one
// goroutine.
type converter struct {
	in    *protocol.RunAgentInput
	model string
	emit  func([]byte) error

	reasoning    int  // reasoning spans opened
	inReasoning  bool // a reasoning span and its message are open
	texts        int  // text messages opened
	inText       bool
	calls        map[int]*toolCall
	order        []int // call indexes in order of appearance
	lastCall     int
	finishReason string
	usage        *tokenUsage
	callIDs      map[string]bool // every tool call id used in the turn
}

// ev emits one event built from key-value pairs.
func (c *converter) ev(typ protocol.EventType, kv ...any) error {
	var b bytes.Buffer
	b.WriteString(`{"type":`)
	b.WriteString(strconv.Quote(string(typ)))
	for i := 0; i+1 < len(kv); i += 2 {
		v, err := json.Marshal(kv[i+1])
		if err != nil {
			return fmt.Errorf("openai: encode %s.%s: %w", typ, kv[i], err)
		}
		b.WriteByte(',')
		b.WriteString(strconv.Quote(kv[i].(string)))
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return c.emit(b.Bytes())
}

func (c *converter) id(kind string, n int) string {
	return c.in.RunID + "." + kind + strconv.Itoa(n)
}

func (c *converter) start() error {
	return c.ev(protocol.RunStarted, "threadId", c.in.ThreadID, "runId", c.in.RunID)
}

// event handles one server-sent event.
func (c *converter) event(ev sse.Event, redact func(string) string) error {
	data := bytes.TrimSpace([]byte(ev.Data))
	if string(data) == "[DONE]" {
		return errDone
	}
	var ch chunk
	if err := json.Unmarshal(data, &ch); err != nil || len(data) == 0 || data[0] != '{' {
		return fmt.Errorf("%w: %s", ErrMalformed, sse.Excerpt([]byte(redact(string(data))), excerptBytes))
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		return providerErr(ch.Error, redact)
	}
	if ch.Model != "" {
		c.model = ch.Model
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // one completion is asked for
		}
		d := choice.Delta
		reasoning := d.ReasoningContent
		if reasoning == nil {
			reasoning = d.Reasoning
		}
		if reasoning != nil && *reasoning != "" {
			if err := c.reason(*reasoning); err != nil {
				return err
			}
		}
		if d.Content != nil && *d.Content != "" {
			if err := c.text(*d.Content); err != nil {
				return err
			}
		}
		for _, tc := range d.ToolCalls {
			if err := c.endReasoning(); err != nil {
				return err
			}
			if err := c.endText(); err != nil {
				return err
			}
			if err := c.toolCall(tc.Index, tc.ID, tc.Function.Name, tc.Function.Arguments); err != nil {
				return err
			}
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			c.finishReason = *choice.FinishReason
			if err := c.endAll(); err != nil {
				return err
			}
		}
	}
	if u := ch.Usage; u != nil {
		c.usage = &tokenUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		if u.PromptTokensDetails != nil {
			c.usage.CachedInputTokens = u.PromptTokensDetails.CachedTokens
		}
		if u.CompletionTokensDetails != nil {
			c.usage.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens
		}
	}
	return nil
}

// providerErr returns the error of an error object in the stream.
func providerErr(raw json.RawMessage, redact func(string) string) error {
	var pe providerError
	if json.Unmarshal(raw, &pe) != nil || pe.Message == "" {
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			pe.Message = s
		} else {
			pe.Message = string(raw)
		}
	}
	msg := sse.Excerpt([]byte(redact(pe.Message)), excerptBytes)
	var tags []string
	if pe.Type != "" {
		tags = append(tags, pe.Type)
	}
	if pe.Code != nil {
		tags = append(tags, fmt.Sprint(pe.Code))
	}
	if len(tags) > 0 {
		msg += " (" + sse.Excerpt([]byte(redact(strings.Join(tags, ", "))), 80) + ")"
	}
	return fmt.Errorf("%w: %s", ErrProvider, msg)
}

func (c *converter) reason(delta string) error {
	if err := c.endText(); err != nil {
		return err
	}
	if !c.inReasoning {
		c.reasoning++
		c.inReasoning = true
		if err := c.ev(protocol.ReasoningStart, "messageId", c.id("reasoning", c.reasoning)); err != nil {
			return err
		}
		if err := c.ev(protocol.ReasoningMessageStart, "messageId", c.id("thought", c.reasoning), "role", "reasoning"); err != nil {
			return err
		}
	}
	return c.ev(protocol.ReasoningMessageContent, "messageId", c.id("thought", c.reasoning), "delta", delta)
}

func (c *converter) endReasoning() error {
	if !c.inReasoning {
		return nil
	}
	c.inReasoning = false
	if err := c.ev(protocol.ReasoningMessageEnd, "messageId", c.id("thought", c.reasoning)); err != nil {
		return err
	}
	return c.ev(protocol.ReasoningEnd, "messageId", c.id("reasoning", c.reasoning))
}

func (c *converter) text(delta string) error {
	if err := c.endReasoning(); err != nil {
		return err
	}
	if !c.inText {
		c.texts++
		c.inText = true
		if err := c.ev(protocol.TextMessageStart, "messageId", c.id("msg", c.texts), "role", "assistant"); err != nil {
			return err
		}
	}
	return c.ev(protocol.TextMessageContent, "messageId", c.id("msg", c.texts), "delta", delta)
}

func (c *converter) endText() error {
	if !c.inText {
		return nil
	}
	c.inText = false
	return c.ev(protocol.TextMessageEnd, "messageId", c.id("msg", c.texts))
}

// toolCall handles one tool_calls delta. A delta without index (servers that send whole calls)
// continues the last call, unless it brings another id or a name when the last has one.
func (c *converter) toolCall(index *int, id, name, args string) error {
	if c.calls == nil {
		c.calls = map[int]*toolCall{}
	}
	var idx int
	switch {
	case index != nil:
		idx = *index
	case len(c.order) == 0,
		id != "" && c.calls[c.lastCall].id != id,
		name != "" && c.calls[c.lastCall].name != "":
		idx = len(c.order)
		for c.calls[idx] != nil {
			idx++
		}
	default:
		idx = c.lastCall
	}
	c.lastCall = idx
	call := c.calls[idx]
	if call == nil {
		call = &toolCall{id: id}
		if call.id == "" {
			call.id = c.id("call", idx)
		}
		if c.callIDs[call.id] {
			return fmt.Errorf("%w: %s", ErrToolCallID, sse.Excerpt([]byte(call.id), 80))
		}
		if c.callIDs == nil {
			c.callIDs = map[string]bool{}
		}
		c.callIDs[call.id] = true
		c.calls[idx] = call
		c.order = append(c.order, idx)
	}
	if !call.started {
		call.name += name
		if call.name == "" {
			if args != "" {
				call.args = append(call.args, args)
			}
			return nil
		}
		call.started = true
		kv := []any{"toolCallId", call.id, "toolCallName", call.name}
		if c.texts > 0 {
			kv = append(kv, "parentMessageId", c.id("msg", c.texts))
		}
		if err := c.ev(protocol.ToolCallStart, kv...); err != nil {
			return err
		}
		for _, a := range call.args {
			if err := c.ev(protocol.ToolCallArgs, "toolCallId", call.id, "delta", a); err != nil {
				return err
			}
		}
		call.args = nil
	}
	if args == "" {
		return nil
	}
	return c.ev(protocol.ToolCallArgs, "toolCallId", call.id, "delta", args)
}

// endAll ends what is open: reasoning, text, tool calls (in order of appearance).
func (c *converter) endAll() error {
	if err := c.endReasoning(); err != nil {
		return err
	}
	if err := c.endText(); err != nil {
		return err
	}
	for _, idx := range c.order {
		call := c.calls[idx]
		if !call.started {
			return fmt.Errorf("%w (index %d)", ErrToolName, idx)
		}
		if err := c.ev(protocol.ToolCallEnd, "toolCallId", call.id); err != nil {
			return err
		}
	}
	c.calls, c.order = nil, nil
	return nil
}

// eof handles the end of a stream that sent no [DONE]: a finished choice suffices (servers
// that omit [DONE]); else the answer was cut short.
func (c *converter) eof() error {
	if c.finishReason == "" {
		return ErrCutShort
	}
	return nil
}

// finish ends the run: RUN_FINISHED with the finish reason and the usage.
func (c *converter) finish() error {
	if err := c.endAll(); err != nil {
		return fmt.Errorf("%s: %w", Prefix, err)
	}
	kv := []any{"threadId", c.in.ThreadID, "runId", c.in.RunID}
	if c.finishReason != "" {
		kv = append(kv, "result", map[string]string{"finishReason": c.finishReason})
	}
	if c.usage != nil {
		c.usage.Model = c.model
		kv = append(kv, "usage", []*tokenUsage{c.usage})
	}
	return c.ev(protocol.RunFinished, kv...)
}
