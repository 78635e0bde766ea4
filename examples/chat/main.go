// Command chat sends one message to a running wsgateway and prints the reply as it streams.
// If the socket drops before the reply is complete, it resumes from the last offset it
// received, as a browser client does, so the reply is printed whole and once.
//
//	go run ./examples/chat hello there
//	go run ./examples/chat -demo '{"tokens":50,"intervalMs":100}' count for me
//	go run ./examples/chat -events hello               print every envelope, not just the text
//	go run ./examples/chat -join <runId>               replay a run's log from its start
//
// Ctrl-C sends an abort frame for the turn ({"type":"abort","runId":…}) and exits.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/coder/websocket"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// envelope is a server frame: {"id":offset,"chunk":event}, or a bare event (then Type is set).
type envelope struct {
	ID    string          `json:"id"`
	Chunk json.RawMessage `json:"chunk"`
	Type  string          `json:"type"`
}

type event struct {
	Type    string `json:"type"`
	Delta   string `json:"delta"`
	Message string `json:"message"`
	Code    string `json:"code"`
}

// Reconnect bounds, like @tanstack/ai-client's defaults.
const (
	maxResumes  = 5
	resumeDelay = 250 * time.Millisecond
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gateway := fs.String("url", "ws://127.0.0.1:8080/ws", "the gateway's WebSocket endpoint")
	demo := fs.String("demo", "", `options of the demo agent, as JSON (forwardedProps.demo), e.g. {"tokens":20}`)
	events := fs.Bool("events", false, "print every envelope as it arrives instead of the reply text")
	join := fs.String("join", "", "replay the log of this runId from its start instead of sending a message")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: chat [flags] message...   (or: chat -join runId)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	text := strings.Join(fs.Args(), " ")
	if (*join == "") == (text == "") {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	c := &client{base: *gateway, events: *events, out: stdout, info: stderr}
	var err error
	if *join != "" {
		err = c.join(ctx, *join)
	} else {
		var props json.RawMessage
		if *demo != "" {
			props = json.RawMessage(`{"demo":` + *demo + `}`)
			if !json.Valid(props) {
				fmt.Fprintln(stderr, "chat: -demo is not valid JSON")
				return 2
			}
		}
		err = c.send(ctx, text, props)
	}
	if err != nil {
		fmt.Fprintln(stderr, "chat:", err)
		return 1
	}
	return 0
}

type client struct {
	base   string
	events bool
	out    io.Writer // the reply, or the envelopes
	info   io.Writer // the runId
	last   string    // the last offset received
}

// send opens a conversation socket, sends one run frame and prints the turn until its
// terminal event, resuming after a drop.
func (c *client) send(ctx context.Context, text string, forwardedProps json.RawMessage) error {
	conn, _, err := websocket.Dial(ctx, c.base, nil)
	if err != nil {
		return fmt.Errorf("dial %s: %w", c.base, err)
	}
	defer conn.CloseNow()
	runID := "run-" + randomHex()
	frame := map[string]any{
		"threadId": "thread-" + randomHex(),
		"runId":    runID,
		"messages": []any{map[string]any{"id": "msg-" + randomHex(), "role": "user", "content": text}},
	}
	if forwardedProps != nil {
		frame["forwardedProps"] = forwardedProps
	}
	b, err := json.Marshal(frame)
	if err != nil {
		return err
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	fmt.Fprintln(c.info, "runId", runID)
	done, err := c.read(ctx, conn, true)
	for resumes := 0; !done; resumes++ {
		if ctx.Err() != nil {
			abort, _ := json.Marshal(map[string]string{"type": "abort", "runId": runID})
			actx, cancel := context.WithTimeout(context.Background(), time.Second)
			conn.Write(actx, websocket.MessageText, abort)
			cancel()
			return errors.New("interrupted: sent an abort frame")
		}
		if c.last == "" || resumes == maxResumes {
			return fmt.Errorf("connection lost: %w", err)
		}
		time.Sleep(resumeDelay)
		conn.CloseNow()
		conn, err = c.resume(ctx, runID, c.last)
		if err != nil {
			continue
		}
		done, err = c.read(ctx, conn, true)
	}
	return err
}

// join prints a run's log from its start until the log is closed.
func (c *client) join(ctx context.Context, runID string) error {
	conn, err := c.resume(ctx, runID, "-1")
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	_, err = c.read(ctx, conn, false)
	return err
}

// resume opens a resume socket reading runID strictly after offset.
func (c *client) resume(ctx context.Context, runID, offset string) (*websocket.Conn, error) {
	u := c.base + "?" + url.Values{"runId": {runID}, "offset": {offset}}.Encode()
	conn, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", u, err)
	}
	return conn, nil
}

// read prints frames. With stopAtTerminal it returns at the first terminal event (done), else
// when the server closes the socket 1000 after the end of the log (done, with the last
// RUN_ERROR as the error). Any other end is a read error.
func (c *client) read(ctx context.Context, conn *websocket.Conn, stopAtTerminal bool) (done bool, err error) {
	var runErr error
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			if !stopAtTerminal && websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return true, runErr
			}
			return false, err
		}
		var env envelope
		if err := json.Unmarshal(data, &env); err != nil {
			return false, fmt.Errorf("frame is not JSON: %q", data)
		}
		if env.Type == "ping" {
			continue
		}
		raw := env.Chunk
		if env.Type != "" { // a bare event: a failure the gateway could not store
			raw = data
		} else {
			c.last = env.ID
		}
		var ev event
		if err := json.Unmarshal(raw, &ev); err != nil {
			return false, fmt.Errorf("event is not JSON: %q", raw)
		}
		if c.events {
			fmt.Fprintf(c.out, "%s\n", data)
		} else if ev.Type == "TEXT_MESSAGE_CONTENT" {
			fmt.Fprint(c.out, ev.Delta)
		}
		if ev.Type != "RUN_FINISHED" && ev.Type != "RUN_ERROR" {
			continue
		}
		if !c.events {
			fmt.Fprintln(c.out)
		}
		runErr = nil
		if ev.Type == "RUN_ERROR" {
			runErr = fmt.Errorf("RUN_ERROR %s: %s", ev.Code, ev.Message)
		}
		if stopAtTerminal || env.Type != "" {
			return true, runErr
		}
	}
}

func randomHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
