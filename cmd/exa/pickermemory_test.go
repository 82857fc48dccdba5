package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/examlops/gateway/picker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestPickerRSS is issue 29's D4 probe against the exa binary with its
// defaults: 5,000 streams that send their request headers and nothing
// more (over 10 connections), then 60 streams that each send an 8 MiB
// body in 64 KiB chunks without end_of_stream (over 6 connections),
// everything held until every body is in or refused, then ended. It
// reports the picker process's RSS (VmRSS) at start, its peak during the
// flood and its value at times after the streams ended. A measurement,
// run with EXA_MEASURE=1 (docs/picker.md, "Security"):
//
//	EXA_MEASURE=1 go test ./cmd/exa -run TestPickerRSS -v
//
// EXA_PICKER_ARGS adds flags to the picker's command line; EXA_PICKER_BIN runs
// another exa binary (an earlier build, to compare); EXA_PICKER_IDLE_STREAMS
// replaces the 5,000 (a multiple of 10).
func TestPickerRSS(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	const (
		idleConns         = 10
		bodies, bodyConns = 60, 6
		bodySize, chunk   = 8 << 20, 64 << 10
	)
	idle := 5000
	if v := os.Getenv("EXA_PICKER_IDLE_STREAMS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "EXA_PICKER_IDLE_STREAMS")
		idle = n
	}
	args := append([]string{"--admin-listen", "127.0.0.1:0"}, strings.Fields(os.Getenv("EXA_PICKER_ARGS"))...)
	addr, line, stderr, proc := startPickerCmd(t, args...)
	admin := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
	require.NotNil(t, admin, "start-up line %q", line)
	rss := func() int64 { return procRSS(t, proc.Pid) }
	metric := func(name string) float64 { return adminMetric(t, admin[1], name) } // -1: not exported

	time.Sleep(time.Second) // let the start settle before the baseline
	start := rss()
	var peak atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if r := rss(); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	dial := func() *grpc.ClientConn {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
		require.NoError(t, err)
		return c
	}
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: ":authority", RawValue: []byte("gw")}, {Key: "content-type", RawValue: []byte("application/json")}}}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	began := time.Now()
	for i := range idleConns {
		c := dial()
		conns = append(conns, c)
		for range idle / idleConns {
			st, err := extprocv3.NewExternalProcessorClient(c).Process(ctx)
			require.NoError(t, err, "idle stream on connection %d", i)
			require.NoError(t, st.Send(headers))
		}
	}
	var refused, exhausted atomic.Int64
	var wg sync.WaitGroup
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, chunk)}}}
	for i := range bodyConns {
		c := dial()
		conns = append(conns, c)
		for range bodies / bodyConns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := extprocv3.NewExternalProcessorClient(c).Process(ctx)
				if err != nil {
					t.Errorf("body stream on connection %d: %v", i, err)
					return
				}
				answered := make(chan struct{})
				go func() {
					switch m, err := st.Recv(); {
					case err == nil && m.GetImmediateResponse() != nil:
						refused.Add(1)
					case status.Code(err) == codes.ResourceExhausted:
						exhausted.Add(1)
					}
					close(answered)
				}()
				if err := st.Send(headers); err != nil {
					return
				}
				for range bodySize / chunk {
					if st.Send(body) != nil {
						<-answered
						return
					}
					select {
					case <-answered:
						return
					default:
					}
				}
			}()
		}
	}
	wg.Wait()
	flood := time.Since(began)
	time.Sleep(2 * time.Second) // hold the flood a while at its height
	during := peak.Load()
	reserved, buffered, streams := metric("exa_picker_reserved_bytes"), metric("exa_picker_buffered_body_bytes"), metric("exa_picker_streams")
	cancel()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	ended := time.Now()
	var after []string
	var at10 int64
	for _, at := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second} {
		time.Sleep(time.Until(ended.Add(at)))
		r := rss()
		if at == 10*time.Second {
			at10 = r
		}
		after = append(after, fmt.Sprintf("%v %d MB", at, r/1e6))
	}
	close(stopSampling)
	<-sampled
	t.Logf("%d header-only streams; picker RSS: %d MB at start; peak %d MB during the flood (sent in %v; of %d bodies %d answered 503, %d streams ended RESOURCE_EXHAUSTED; %.1f MiB reserved, %.0f MiB of them bodies, %.0f streams); after the streams ended: %s (streams %.0f)",
		idle, start/1e6, during/1e6, flood.Round(time.Millisecond), bodies, refused.Load(), exhausted.Load(), reserved/(1<<20), buffered/(1<<20), streams,
		strings.Join(after, ", "), metric("exa_picker_streams"))
	if os.Getenv("EXA_PICKER_ARGS") == "" {
		// Issue 29's bar at the default budget: within 1.5 times it during
		// the flood, within 100 MB of the start 10 s after.
		assert.LessOrEqual(t, during, int64(picker.DefaultMaxBufferedBytes)*3/2, "peak RSS past 1.5 x the budget")
		assert.LessOrEqual(t, at10, start+100e6, "RSS 10 s after the streams ended")
	}
	_ = stderr
}
