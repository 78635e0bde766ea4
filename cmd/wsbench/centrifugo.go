package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"
)

// centrifugoMain measures a catch-up on Centrifugo beside the gateway's (bench/run's
// shortcatchup scenario): it publishes --events publications into a channel with history
// through Centrifugo's HTTP API, then --repeat times dials its WebSocket endpoint, connects,
// subscribes with recovery from the channel's start (offset 0 of its current epoch) and times
// the dial to the receipt of the last recovered publication. It dials and reads with the same
// coder/websocket client as a gateway replay; the frames differ only by protocol: Centrifugo
// returns the recovered publications inside its subscribe reply, the gateway sends one frame
// per event. Every replay must return every publication, offsets 1…N in order.
//
// The report is a load report whose replay section holds the figures, so that bench/run's
// table reads it like the gateway's.
func centrifugoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench centrifugo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wsURL := fs.String("url", "ws://127.0.0.1:8000/connection/websocket", "Centrifugo's WebSocket endpoint (JSON protocol)")
	apiURL := fs.String("api-url", "http://127.0.0.1:8000/api", "Centrifugo's HTTP API")
	apiKey := fs.String("api-key", "", "Centrifugo's HTTP API key")
	channel := fs.String("channel", "wsbench-catchup", "the channel to fill and recover")
	events := fs.Int("events", 1000, "publications in the channel's history")
	repeat := fs.Int("repeat", 200, "replays, one after the other")
	label := fs.String("label", "", "a name for this run in the report")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *events < 1 || *repeat < 1 {
		fmt.Fprintln(stderr, "wsbench centrifugo: --events and --repeat must be at least 1")
		return 2
	}
	c := &centrifugo{api: *apiURL, key: *apiKey, channel: *channel}
	epoch, err := c.fill(ctx, *events)
	if err != nil {
		fmt.Fprintln(stderr, "wsbench centrifugo:", err)
		return 1
	}
	rep := &report{Label: *label, URL: *wsURL, Sockets: 1, EventsPerTurn: *events, Replay: &replayReport{}}
	if rep.Label == "" {
		rep.Label = *wsURL
	}
	var lat, first []time.Duration
	start := time.Now()
	for range *repeat {
		if ctx.Err() != nil {
			break
		}
		f, l, err := c.recover(ctx, *wsURL, epoch, *events)
		if err != nil {
			rep.Errors++
			if rep.ErrorSample == nil {
				rep.ErrorSample = []string{err.Error()}
			}
			continue
		}
		first, lat = append(first, f), append(lat, l)
		rep.Replay.Runs++
		rep.Replay.Events += int64(*events)
	}
	rep.Replay.Seconds = time.Since(start).Seconds()
	rep.Replay.EventsPerSec = float64(rep.Replay.Events) / rep.Replay.Seconds
	rep.Replay.Latency, rep.Replay.FirstLatency = summarize(lat), summarize(first)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		rep.writeTable(stdout)
	}
	if rep.Errors > 0 {
		return 1
	}
	return 0
}

// centrifugo is one Centrifugo server's HTTP API and the channel measured.
type centrifugo struct {
	api, key, channel string
}

// call posts one HTTP API command and decodes its result into out.
func (c *centrifugo) call(ctx context.Context, method string, params, out any) error {
	body, err := json.Marshal(params)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api+"/"+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: HTTP %d: %w", method, resp.StatusCode, err)
	}
	if r.Error != nil {
		return fmt.Errorf("%s: error %d %s", method, r.Error.Code, r.Error.Message)
	}
	if out != nil && r.Result != nil {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}

// fill publishes n event-sized publications (the data of the gateway's content events) into
// an emptied channel and returns the epoch of its history.
func (c *centrifugo) fill(ctx context.Context, n int) (string, error) {
	if err := c.call(ctx, "history_remove", map[string]any{"channel": c.channel}, nil); err != nil {
		return "", err
	}
	for i := range n {
		data := json.RawMessage(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"bench-x.msg1","delta":"t%d "}`, i+1))
		if err := c.call(ctx, "publish", map[string]any{"channel": c.channel, "data": data}, nil); err != nil {
			return "", err
		}
	}
	var h struct {
		Offset uint64 `json:"offset"`
		Epoch  string `json:"epoch"`
	}
	if err := c.call(ctx, "history", map[string]any{"channel": c.channel, "limit": 0}, &h); err != nil {
		return "", err
	}
	if h.Offset < uint64(n) {
		return "", fmt.Errorf("history holds offset %d after %d publications: is history_size at least %d?", h.Offset, n, n)
	}
	return h.Epoch, nil
}

// recover dials, connects and subscribes with recovery from the channel's start, checks that
// every publication 1…n came back in order, and returns the times from the dial to the first
// and to the last of them.
func (c *centrifugo) recover(ctx context.Context, wsURL, epoch string, n int) (first, last time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	conn, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		return 0, 0, err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20)
	cmds := fmt.Appendf(nil, "{\"id\":1,\"connect\":{\"name\":\"wsbench\"}}\n{\"id\":2,\"subscribe\":{\"channel\":%s,\"recover\":true,\"offset\":0,\"epoch\":%s}}",
		strconv.Quote(c.channel), strconv.Quote(epoch))
	if err := conn.Write(ctx, websocket.MessageText, cmds); err != nil {
		return 0, 0, err
	}
	type publication struct {
		Offset uint64          `json:"offset"`
		Data   json.RawMessage `json:"data"`
	}
	type reply struct {
		ID    uint32          `json:"id"`
		Error json.RawMessage `json:"error"`
		Sub   *struct {
			Recovered    bool          `json:"recovered"`
			Publications []publication `json:"publications"`
		} `json:"subscribe"`
		Push *struct {
			Pub *publication `json:"pub"`
		} `json:"push"`
	}
	var next uint64 = 1
	for next <= uint64(n) {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("after %d publications: %w", next-1, err)
		}
		recv := time.Now()
		// A frame holds one reply or several, one a line.
		dec := json.NewDecoder(bytes.NewReader(data))
		for dec.More() {
			var r reply
			if err := dec.Decode(&r); err != nil {
				return 0, 0, fmt.Errorf("reply %q: %w", data, err)
			}
			if r.Error != nil {
				return 0, 0, fmt.Errorf("reply %d: error %s", r.ID, r.Error)
			}
			var pubs []publication
			switch {
			case r.Sub != nil:
				if !r.Sub.Recovered {
					return 0, 0, errors.New("subscribe reply: not recovered")
				}
				pubs = r.Sub.Publications
			case r.Push != nil && r.Push.Pub != nil:
				pubs = []publication{*r.Push.Pub}
			}
			for _, p := range pubs {
				if p.Offset != next {
					return 0, 0, fmt.Errorf("publication of offset %d, want %d", p.Offset, next)
				}
				if next == 1 {
					first = recv.Sub(start)
				}
				last = recv.Sub(start)
				next++
			}
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return first, last, nil
}
