package main

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkReplayFloor measures what the short catch-up's client (the replay reader of
// bench/run shortcatchup: coder/websocket, the frame parser and the checker) needs on its
// own to read a 1,000-event run: a server that costs nothing sends the handshake's answer
// and the run's 1,000 envelopes, one frame each, in one write. p50-ms is the median time from
// the dial to the last event, the figure bench/run reports, and read-p50-ms the part after
// the dial returned.
//
//	go test -run '^$' -bench ReplayFloor -benchtime 200x ./cmd/wsbench/
func BenchmarkReplayFloor(b *testing.B) {
	const tokens = 995
	wire := floorFrames(tokens)
	addr := serveLoopback(b, func(c net.Conn) { serveFloor(c, wire) })
	s := &sock{b: &bench{cfg: loadConfig{Tokens: tokens, ReadLimitMiB: 16}}, client: &http.Client{}, chk: newChecker(tokens)}
	url := "ws://" + addr + "/ws?runId=r1&offset=-1"
	var lat, read []time.Duration
	b.ResetTimer()
	for range b.N {
		dialed := time.Now()
		conn, err := s.dial(context.Background(), url)
		if err != nil {
			b.Fatal(err)
		}
		ready := time.Now()
		s.chk.reset(tokens)
		for !s.chk.done {
			if err := s.read(conn); err != nil {
				b.Fatalf("after %d events: %v", s.chk.events, err)
			}
			if err := s.chk.add(s.offset, &s.ev); err != nil {
				b.Fatal(err)
			}
		}
		lat, read = append(lat, s.recv.Sub(dialed)), append(read, s.recv.Sub(ready))
		conn.CloseNow()
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(read)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(read[len(read)/2].Microseconds())/1000, "read-p50-ms")
}

// floorFrames returns the WebSocket frames of a finished run of the demo agent's script with
// tokens deltas, as the gateway sends them (an envelope per event, offsets of its length),
// then a close frame.
func floorFrames(tokens int) []byte {
	var wire []byte
	n := 0
	add := func(event string) {
		p := fmt.Appendf(nil, `{"id":"000001-%012x-%04x-0123456789ab","chunk":%s}`, 2+n/400, n%400, event)
		n++
		wire = append(wire, 0x81) // FIN, text
		if len(p) < 126 {
			wire = append(wire, byte(len(p)))
		} else {
			wire = append(wire, 126, byte(len(p)>>8), byte(len(p)))
		}
		wire = append(wire, p...)
	}
	add(`{"type":"CUSTOM","name":"run.accepted","value":{"runId":"floor-1"}}`)
	add(`{"type":"RUN_STARTED","threadId":"floor","runId":"floor-1"}`)
	add(`{"type":"TEXT_MESSAGE_START","messageId":"floor-1.msg1","role":"assistant"}`)
	for i := 1; i <= tokens; i++ {
		add(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"floor-1.msg1","delta":"t%d "}`, i))
	}
	add(`{"type":"TEXT_MESSAGE_END","messageId":"floor-1.msg1"}`)
	add(`{"type":"RUN_FINISHED","threadId":"floor","runId":"floor-1"}`)
	return append(wire, 0x88, 2, 0x03, 0xe8) // close 1000
}

// serveFloor answers one WebSocket handshake on c with the handshake's answer and wire in one
// write, then waits for the client to close.
func serveFloor(c net.Conn, wire []byte) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	answer := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n"
	if _, err := c.Write(append([]byte(answer), wire...)); err != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br.WriteTo(discard{})
}

// discard is io.Discard without ReaderFrom, so that WriteTo reads until the client closes.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
