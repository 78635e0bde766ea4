// Command wsbench is a load generator for any server that speaks the gateway's wire protocol
// (PROTOCOL.md sections 2 and 3): wsgateway itself, or the @tanstack/ai reference server in
// bench/. BENCHMARKS.md has the scenarios and results.
//
//	wsbench [flags]                 open conversation sockets, stream turns, check and measure
//	wsbench raw-jetstream [flags]   the machine's limit: raw JetStream asynchronous publishes,
//	                                or (--rate) the latency of paced synchronous ones
//	wsbench raw-websocket [flags]   the machine's limit: raw coder/websocket text frames
//	wsbench centrifugo [flags]      a catch-up from Centrifugo's channel history, beside the
//	                                gateway's replay (bench/run shortcatchup)
//	wsbench table RESULTS_DIR       the side-by-side table of bench/run's JSON results
//	wsbench delay-proxy [flags]     a TCP proxy adding a delay each way (NATS far away)
//	wsbench page-faults [flags]     what the machine charges for a fresh page of memory
//	wsbench hostile [flags]         one principal starting long turns by every door and
//	                                walking away, another principal's turns meanwhile (bench/hostile)
//
// A load run opens --sockets conversation sockets (from --source-ips loopback addresses, so
// ten thousand sockets do not exhaust one address's ephemeral ports), lets them sit idle for
// --idle-settle and measures the server's resident memory per idle socket (--pid reads
// /proc/<pid>/status, --metrics-url reads process_resident_memory_bytes), then has --active of
// them send --turns run frames each, one after the other, asking the demo agent for --tokens
// content deltas --interval-ms apart. With --drop > 0 a socket is cut at random while a turn
// streams and the client resumes with ?runId=&offset=<last offset>, as @tanstack/ai-client does.
//
// Every turn's events are checked against the demo agent's script (RUN_STARTED,
// TEXT_MESSAGE_START, deltas "t1 " … "tN ", TEXT_MESSAGE_END, RUN_FINISHED, after the
// server's CUSTOM run.accepted): a gap, a duplicate offset, an unexpected event or a turn that
// does not end is an error. The report gives events/s delivered, latency percentiles, resumes,
// errors and memory, as a table or, with --json, as one JSON object. A progress line goes to
// stderr every --progress.
//
// Latency: with --timestamps, run frames ask for forwardedProps.demo.timestamps, so the agent
// stamps every event with its emit time (off by default: it costs the servers, the reference
// one most), and each agent event that carries one is measured from it to the moment its
// frame was read, before it is decoded ("event latency"). The emit time is the event's
// metadata.emitMicros (microseconds since the epoch) when present, else its AG-UI timestamp
// (whole milliseconds, rounded down at the emit: up to a millisecond too early). The first
// event of every turn is measured from the moment its run frame was written ("first-event
// latency"). With --metrics-url the gateway's own delivery histogram (agent emit to socket
// write) is read before and after the load and its percentiles are reported too. The report
// also gives wsbench's own CPU time per event: it shares the machine with the server.
//
// The client is lean, so that its CPU takes as little as possible from a server on the same
// cores: frames are read without a per-read context (a turn is bounded by a watchdog that
// closes its socket) and decoded with protocol.Fields, which splits a frame without decoding
// the fields the checker does not read.
//
// Exit status: 0 when every turn completed with a correct sequence and no error, 1 when the
// run found errors, 2 for a bad command line.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches the subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "raw-jetstream":
			return rawJetStreamMain(ctx, args[1:], stdout, stderr)
		case "raw-websocket":
			return rawWebSocketMain(ctx, args[1:], stdout, stderr)
		case "centrifugo":
			return centrifugoMain(ctx, args[1:], stdout, stderr)
		case "table":
			return tableMain(args[1:], stdout, stderr)
		case "delay-proxy":
			return delayProxyMain(ctx, args[1:], stdout, stderr)
		case "page-faults":
			return pageFaultsMain(args[1:], stdout, stderr)
		case "hostile":
			return hostileMain(ctx, args[1:], stdout, stderr)
		case "help", "-h", "--help":
			fmt.Fprintln(stderr, "usage: wsbench [flags] | wsbench raw-jetstream [flags] | wsbench raw-websocket [flags] | wsbench centrifugo [flags] | wsbench table DIR | wsbench delay-proxy [flags] | wsbench page-faults [flags]")
			fmt.Fprintln(stderr, "run a subcommand with -h for its flags")
			return 0
		}
	}
	return loadMain(ctx, args, stdout, stderr)
}
