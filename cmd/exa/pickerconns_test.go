package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/picker"
)

// TestPickerIdleConns is issue 29's N6 probe against the exa binary with
// its defaults: 1,024 TCP connections that send the HTTP/2 preface and a
// SETTINGS frame and then nothing (not even a ping's acknowledgement),
// 600 that never send the preface, and 2,000 of those opened at once to
// the connection bound. It reports when the picker closed each kind, the
// picker's RSS with the first, and how many the bound let in. A measurement, run with EXA_MEASURE=1
// (docs/picker.md, "Security"):
//
//	EXA_MEASURE=1 go test ./cmd/exa -run TestPickerIdleConns -v
//
// EXA_PICKER_ARGS adds flags to the picker's command line; EXA_PICKER_BIN runs
// another exa binary (an earlier build, to compare).
func TestPickerIdleConns(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	args := append([]string{"--admin-listen", "127.0.0.1:0"}, strings.Fields(os.Getenv("EXA_PICKER_ARGS"))...)
	addr, line, _, proc := startPickerCmd(t, args...)
	rss := func() int64 { return procRSS(t, proc.Pid) }
	admin := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
	require.NotNil(t, admin, "start-up line %q", line)
	metrics := func() string {
		resp, err := http.Get(admin[1] + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "exa_picker_connections") {
				out = append(out, l)
			}
		}
		return strings.Join(out, ", ")
	}
	const watch = 60 * time.Second
	// closeTimes opens n connections, writes greeting on each, and returns
	// how long after its opening the picker closed each (watch: never).
	closeTimes := func(n int, greeting []byte) []time.Duration {
		out := make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range n {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			opened := time.Now()
			if greeting != nil {
				_, err = c.Write(greeting)
				require.NoError(t, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetReadDeadline(opened.Add(watch))
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						out[i] = time.Since(opened)
						if ne, ok := err.(net.Error); ok && ne.Timeout() {
							out[i] = watch
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		return out
	}
	describe := func(ds []time.Duration) string {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		open := 0
		for _, d := range ds {
			if d >= watch {
				open++
			}
		}
		return fmt.Sprintf("closed after %v (first) to %v (last); %d of %d still open at %v",
			ds[0].Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond), open, len(ds), watch)
	}
	// The HTTP/2 client preface and an empty SETTINGS frame.
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

	time.Sleep(time.Second)
	start := rss()
	var idle []time.Duration
	done := make(chan struct{})
	go func() { idle = closeTimes(1024, preface); close(done) }()
	time.Sleep(3 * time.Second)
	rssIdle := rss()
	<-done
	t.Logf("1,024 connections idle after the preface: %s; RSS %d MB 3 s in, %d MB at start", describe(idle), rssIdle/1e6, start/1e6)
	noPreface := closeTimes(600, nil)
	t.Logf("600 connections without a preface: %s", describe(noPreface))
	var bound []time.Duration
	done = make(chan struct{})
	go func() { bound = closeTimes(2000, nil); close(done) }()
	time.Sleep(2 * time.Second)
	during := metrics()
	<-done
	refused := 0
	for _, d := range bound {
		if d < time.Second {
			refused++
		}
	}
	t.Logf("2,000 connections without a preface at once: %d closed within 1 s of their opening; %s; 2 s in: %s",
		refused, describe(bound), during)
	if os.Getenv("EXA_PICKER_ARGS") == "" {
		// Issue 29's bar: idle or slow connections closed within 15 s, a
		// bound on their number.
		for _, ds := range [][]time.Duration{idle, noPreface, bound} {
			assert.Less(t, ds[len(ds)-1], 15*time.Second, "the last connection closed") // sorted by describe
		}
		assert.Equal(t, 2000-picker.DefaultMaxConnections, refused, "connections refused past the bound")
	}
}
