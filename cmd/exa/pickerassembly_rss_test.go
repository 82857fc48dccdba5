package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// procRSS is the VmRSS of process pid, in bytes.
func procRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	require.NotNil(t, m)
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n << 10
}

// adminMetric reads an unlabelled metric from the admin server at base
// (http://host:port); -1 when it is not exported.
// peaks samples a process's RSS every 20 ms, and metrics every so many
// samples, keeping the largest of each, until stop.
type peaks struct {
	max        []atomic.Int64 // the RSS's, then each metric's
	quit, done chan struct{}
}

// samplePeaks starts sampling rss, and each of metrics every every
// samples.
func samplePeaks(rss func() int64, every int, metrics ...func() int64) *peaks {
	p := &peaks{max: make([]atomic.Int64, 1+len(metrics)), quit: make(chan struct{}), done: make(chan struct{})}
	keep := func(m *atomic.Int64, v int64) {
		if v > m.Load() {
			m.Store(v)
		}
	}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			keep(&p.max[0], rss())
			if i%every == 0 {
				for j, f := range metrics {
					keep(&p.max[1+j], f())
				}
			}
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// rss is the peak RSS so far; metric the peak of metrics[i].
func (p *peaks) rss() int64         { return p.max[0].Load() }
func (p *peaks) metric(i int) int64 { return p.max[1+i].Load() }

// stop ends the sampling.
func (p *peaks) stop() {
	close(p.quit)
	<-p.done
}

func adminMetric(t *testing.T, base, name string) float64 {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// TestPickerRSSAssembled is TestPickerRSS for the answers the picker
// assembles (--upstream-stream, picker/upstream.go): against the exa
// binary with its defaults and a model with one replica (no engine: the
// test plays Envoy and the engine's answer over ext_proc), 60 streams at
// once (over 6 connections) in FULL_DUPLEX_STREAMED mode each send a
// non-streamed chat request, then response headers (200,
// text/event-stream) and an SSE answer of 8 MiB of content (16 KiB
// events) in 64 KiB chunks. Each stream ends assembled (the JSON answer,
// whole), refused (an immediate 503: the answer past --max-buffered-bytes)
// or relayed as it is (no room to assemble at the request). It reports
// the picker's RSS at start, its peak during the flood and its value
// after the streams ended, and the budget's metrics at the flood's
// height. A measurement, run with EXA_MEASURE=1:
//
//	go test ./cmd/exa -c -o /tmp/exa-cmd.test && cd cmd/exa &&
//	EXA_MEASURE=1 /tmp/exa-cmd.test -test.run TestPickerRSSAssembled -test.v
//
// EXA_PICKER_ARGS adds flags to the picker's command line. Measured on
// 2 shared cores at the default budget (256 MiB), with each answer
// charged once what its Aggregator holds: 31 assembled, 29 refused; peak
// RSS 433-473 MB, past the budget + 100 MB. A heap profile at the flood's
// height (EXA_PICKER_ARGS "--pprof-listen 127.0.0.1:6061",
// /debug/pprof/heap) held 259 MB in sseagg.(*Aggregator).join (charged)
// and 98 MB in gRPC's mem.(*sizedBufferPool).Get under picker.sendParts:
// the encoded copies of the answers being sent. Charged sseagg.Charge (2)
// times, as the HTTP gateway charges its own: 15 assembled, 45 refused;
// peak RSS 333-341 MB (start 39-48 MB), 58-97 MB 10 s after (2 runs).
func TestPickerRSSAssembled(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	const (
		streams, conns = 60, 6
		content, event = 8 << 20, 16 << 10 // the answer's content, one event's
		chunk          = 64 << 10
	)
	// The engine's stream: content/event events of event bytes of
	// content, usage, [DONE]; sent in chunk-byte cuts.
	const head = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{"content":"`
	var sse strings.Builder
	ev := head + strings.Repeat("x", event) + `"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	for range content / event {
		sse.WriteString(ev)
	}
	sse.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":512,"total_tokens":517}}` + "\n\ndata: [DONE]\n\n")
	stream := []byte(sse.String())
	var chunks [][]byte
	for off := 0; off < len(stream); off += chunk {
		chunks = append(chunks, stream[off:min(off+chunk, len(stream))])
	}

	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "m1", "--replica", "r0=http://127.0.0.1:9")
	args := append([]string{"--admin-listen", "127.0.0.1:0"}, strings.Fields(os.Getenv("EXA_PICKER_ARGS"))...)
	addr, line, stderr, proc := startPickerWith(t, cfg, args...)
	admin := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
	require.NotNil(t, admin, "start-up line %q", line)
	rss := func() int64 { return procRSS(t, proc.Pid) }
	metric := func(name string) float64 { return adminMetric(t, admin[1], name) }

	time.Sleep(time.Second) // let the start settle before the baseline
	start := rss()
	pk := samplePeaks(rss, 5, // the metrics every 100 ms
		func() int64 { return int64(metric("exa_picker_assembled_bytes")) },
		func() int64 { return int64(metric("exa_picker_reserved_bytes")) })

	pc := &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	reqBody := []byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":false}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var clients []*pickertest.Client
	for range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer c.Close()
		clients = append(clients, pickertest.NewClient(c))
	}
	var assembled, refused, relayed, early atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	for i := range streams {
		wg.Go(func() {
			x, err := clients[i%conns].Open(ctx)
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			// The request phase, as Envoy sends it in FULL_DUPLEX_STREAMED.
			h := pickertest.RequestHeaders(false, nil, ":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw", ":scheme", "http", "content-type", "application/json")
			h.ProtocolConfig = pc
			if err := x.Send(h); err != nil {
				t.Errorf("stream %d: request headers: %v", i, err)
				return
			}
			if err := x.Send(pickertest.RequestBody(reqBody, true)); err != nil {
				t.Errorf("stream %d: request body: %v", i, err)
				return
			}
			m, err := x.Recv()
			if err != nil {
				t.Errorf("stream %d: request headers answer: %v", i, err)
				return
			}
			if im := m.GetImmediateResponse(); im != nil {
				if im.GetStatus().GetCode() == http.StatusServiceUnavailable {
					early.Add(1)
				} else {
					t.Errorf("stream %d: immediate response %d at the request: %s", i, im.GetStatus().GetCode(), im.GetBody())
				}
				return
			}
			var toEngine []byte
			for eos := false; !eos; {
				m, err := x.Recv()
				if err != nil {
					t.Errorf("stream %d: request body answer: %v", i, err)
					return
				}
				sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				toEngine = append(toEngine, sr.GetBody()...)
				eos = sr.GetEndOfStream()
			}
			asked := strings.Contains(string(toEngine), `"stream":true`)
			// The response phase: the engine's answer.
			var out []byte
			for j, c := range append([][]byte{nil}, chunks...) {
				if j == 0 {
					err = x.ResponseHeaders(200, []picker.Header{{Name: "content-type", Value: "text/event-stream"}}, nil, false)
				} else {
					var b []byte
					b, err = x.ResponseBody(c, j == len(chunks))
					out = append(out, b...)
				}
				if err != nil {
					break
				}
			}
			var ie *pickertest.ImmediateError
			switch {
			case errors.As(err, &ie):
				if ie.Response.GetStatus().GetCode() != http.StatusServiceUnavailable || !strings.Contains(string(ie.Response.GetBody()), "assembly_over_budget") {
					t.Errorf("stream %d: immediate response %d: %s", i, ie.Response.GetStatus().GetCode(), ie.Response.GetBody())
				}
				if len(out) != 0 {
					t.Errorf("stream %d: %d bytes of answer before the 503", i, len(out))
				}
				refused.Add(1)
			case err != nil:
				t.Errorf("stream %d: response: %v", i, err)
			case !asked: // no room to assemble: relayed as it is
				if string(out) != string(stream) {
					t.Errorf("stream %d: relayed %d bytes, want the engine's %d", i, len(out), len(stream))
				}
				relayed.Add(1)
			default:
				var v struct {
					Object  string `json:"object"`
					Choices []struct {
						Message struct {
							Content string `json:"content"`
						} `json:"message"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(out, &v); err != nil || v.Object != "chat.completion" || len(v.Choices) != 1 || len(v.Choices[0].Message.Content) != content {
					t.Errorf("stream %d: assembled answer of %d bytes not whole (%v)", i, len(out), err)
					return
				}
				assembled.Add(1)
			}
		})
	}
	wg.Wait()
	flood := time.Since(began)
	during := pk.rss()
	asmNow, resNow := metric("exa_picker_assembled_bytes"), metric("exa_picker_reserved_bytes")
	cancel()
	ended := time.Now()
	var after []string
	for _, at := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second} {
		time.Sleep(time.Until(ended.Add(at)))
		after = append(after, fmt.Sprintf("%v %d MB", at, rss()/1e6))
	}
	pk.stop()
	t.Logf("%d streams of an %d MiB assembled answer (%d MiB of SSE in %d KiB chunks): picker RSS %d MB at start, peak %d MB during the flood (%v); %d assembled, %d refused 503 over budget, %d relayed unassembled, %d refused at the request; peak exa_picker_assembled_bytes %.1f MiB, peak reserved %.1f MiB (budget --max-buffered-bytes %d MiB); at the end assembled %.0f, reserved %.0f; after the streams ended: %s",
		streams, content>>20, len(stream)>>20, chunk>>10, start/1e6, during/1e6, flood.Round(time.Millisecond),
		assembled.Load(), refused.Load(), relayed.Load(), early.Load(),
		float64(pk.metric(0))/(1<<20), float64(pk.metric(1))/(1<<20), picker.DefaultMaxBufferedBytes>>20, asmNow, resNow,
		strings.Join(after, ", "))
	assert.Equal(t, int64(streams), assembled.Load()+refused.Load()+relayed.Load()+early.Load(), "every stream assembled, refused or relayed whole")
	assert.Zero(t, asmNow, "every answer's share returned")
	if os.Getenv("EXA_PICKER_ARGS") == "" {
		assert.LessOrEqual(t, pk.metric(1), int64(picker.DefaultMaxBufferedBytes), "reserved past the budget")
	}
	_ = stderr
}
