package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"syscall"
	"time"
)

// pageFaultsMain measures what the machine charges for a fresh page of memory: it maps --mib
// MiB of anonymous memory, writes one byte to each page (one minor fault each), and reports
// the faults counted by the kernel and the time per fault, wall and CPU, for --rounds
// mappings. A gateway whose heap grows (a fresh process's first burst of turns, the NATS file
// store's write cache filling) pays this for every new page; on most machines it is well
// under a microsecond, on some virtual machines tens of microseconds (BENCHMARKS.md).
func pageFaultsMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wsbench page-faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mib := fs.Int("mib", 256, "memory mapped and touched per round, in MiB")
	rounds := fs.Int("rounds", 3, "mappings measured, one after the other")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *mib <= 0 || *rounds <= 0 {
		fmt.Fprintln(stderr, "wsbench page-faults: --mib and --rounds must be positive")
		return 2
	}
	var res []faultRound
	for range *rounds {
		r, err := touchPages(*mib << 20)
		if err != nil {
			fmt.Fprintln(stderr, "wsbench page-faults:", err)
			return 1
		}
		res = append(res, r)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"pageBytes": syscall.Getpagesize(), "rounds": res}); err != nil {
		fmt.Fprintln(stderr, "wsbench page-faults:", err)
		return 1
	}
	return 0
}

// faultRound is one mapping's measurement.
type faultRound struct {
	Pages          int     `json:"pages"`
	Faults         int64   `json:"faults"` // minor faults the kernel counted meanwhile
	WallMicros     float64 `json:"wallMicrosPerPage"`
	CPUMicros      float64 `json:"cpuMicrosPerPage"` // user and system time
	MiBPerSecWrite float64 `json:"mibPerSec"`
}

// touchPages maps n bytes, writes one byte per page, and unmaps them.
func touchPages(n int) (faultRound, error) {
	page := syscall.Getpagesize()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return faultRound{}, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	defer syscall.Munmap(b)
	var before, after syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		return faultRound{}, err
	}
	start := time.Now()
	for i := 0; i < n; i += page {
		b[i] = 1
	}
	wall := time.Since(start)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
		return faultRound{}, err
	}
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	pages := n / page
	return faultRound{
		Pages:          pages,
		Faults:         after.Minflt - before.Minflt,
		WallMicros:     float64(wall.Nanoseconds()) / 1e3 / float64(pages),
		CPUMicros:      float64(cpu.Nanoseconds()) / 1e3 / float64(pages),
		MiBPerSecWrite: float64(n) / (1 << 20) / wall.Seconds(),
	}, nil
}
