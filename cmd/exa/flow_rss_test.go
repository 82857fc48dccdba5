package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker/pickertest"
)

// TestFlowRSS measures the RSS of an exa process holding a flood of
// requests in flow control, for both fronts: `exa serve gateway` and
// `exa serve picker` (behind the Envoy stand-in, pickertest.Envoy, over 5
// connections since one takes 1,024 streams), each with --flow-control,
// --flow-ttl 5s and --shed-outstanding 1 over one engine that holds one
// streamed request (enginetest's gate), so that no request has room: the
// room rule never opens. 4,096 requests (--flow-max-requests, the
// default) are then sent at once, each one connection, with a body of
// 4 KiB (all held: 16 MiB of 64) and, in a second run, of 24 KiB (96 MiB:
// --flow-max-bytes, 64 MiB, refuses a third). Each request is answered
// 503 queue_timeout at its deadline or 429 with Retry-After when the
// queue is full, or by the picker 503 overloaded when the streams' bodies
// pass its --max-buffered-bytes (256 MiB, 32 KiB a stream and the bodies
// read); nothing else. It reports the process's RSS (VmRSS) before the
// flood, its peak, the peak per held request, the counts of each answer,
// and the RSS 1 s, 5 s and 15 s after the last answer. A
// measurement, run with EXA_MEASURE=1 (docs/flow-control.md, "Bounds and
// costs"):
//
//	go test ./cmd/exa -c -o /tmp/exa-cmd.test && cd cmd/exa &&
//	EXA_MEASURE=1 /tmp/exa-cmd.test -test.run TestFlowRSS -test.v
//
// EXA_FLOW_ARGS adds flags to the front's command line (such as
// --pprof-listen, to take a heap profile during the flood).
func TestFlowRSS(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	for _, front := range []string{"gateway", "picker"} {
		for _, body := range []int{4 << 10, 24 << 10} {
			t.Run(fmt.Sprintf("%s/%dKiB", front, body>>10), func(t *testing.T) { flowRSS(t, front, body) })
		}
	}
}

// flowRSSBound is the RSS no run may pass: generous, 2.9× the largest
// peak measured, 366 MB (docs/flow-control.md).
const flowRSSBound = 1 << 30

func flowRSS(t *testing.T, front string, bodySize int) {
	const (
		requests = 4096
		ttl      = 5 * time.Second
		conns    = 5 // picker: gRPC connections, 1,024 streams each
	)
	// EXA_MODELS=N spreads the flood over N models (m1..mN) served by
	// one engine: their queues share the process's one budget.
	models := 1
	if v, err := strconv.Atoi(os.Getenv("EXA_MODELS")); err == nil && v > 1 {
		models = v
	}
	served := "m1"
	if models > 1 {
		served = "" // any model
	}
	e := enginetest.New(enginetest.Options{Name: "e0", Model: served})
	t.Cleanup(e.Close)
	release := e.Gate()
	t.Cleanup(release)
	cfg := newConfig(t)
	for m := range models {
		ok(t, cfg, "serve", "routing", "set", fmt.Sprint("m", m+1), "--replica", "r0="+e.URL())
	}
	args := append([]string{"--flow-control", "--flow-ttl", ttl.String(), "--shed-outstanding", "1"}, strings.Fields(os.Getenv("EXA_FLOW_ARGS"))...)
	var base, metrics string // where requests go, where /metrics is
	var proc *os.Process
	if front == "gateway" {
		base, proc = startGatewayWith(t, cfg, append(args, "--listen", "127.0.0.1:0")...)
		metrics = base
	} else {
		addr, line, _, p := startPickerWith(t, cfg, append(args, "--admin-listen", "127.0.0.1:0")...)
		proc = p
		admin := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
		require.NotNil(t, admin, "start-up line %q", line)
		metrics = admin[1]
		var envoys []*pickertest.Envoy
		for range conns {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			envoys = append(envoys, &pickertest.Envoy{Client: pickertest.NewClient(c)})
		}
		var next atomic.Uint64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			envoys[next.Add(1)%conns].ServeHTTP(w, r)
		}))
		srv.Start()
		t.Cleanup(srv.Close)
		base = srv.URL
	}
	rss := func() int64 { return procRSS(t, proc.Pid) }
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0,
		DialContext: (&net.Dialer{Timeout: 30 * time.Second}).DialContext}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	post := func(body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return client.Do(req)
	}

	// One streamed request a model held at the engine: each model's
	// replica is at --shed-outstanding, and stays there until the end.
	first := make(chan error, models)
	for m := range models {
		go func() {
			resp, err := post(fmt.Sprintf(`{"model":"m%d","stream":true,"messages":[{"role":"user","content":"hold"}]}`, m+1))
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			first <- err
		}()
		select {
		case <-e.Gated():
		case <-time.After(30 * time.Second):
			t.Fatalf("the first request of m%d did not reach the engine within 30 s", m+1)
		}
	}
	time.Sleep(time.Second) // let the start settle before the baseline
	start := rss()

	pk := samplePeaks(rss, 10, // the queue's gauge every 200 ms
		func() int64 { return int64(flowMetric(t, metrics, "exa_gateway_flow_queue_requests", "")) })

	pad := strings.Repeat("x", bodySize-len(`{"model":"m1","messages":[{"role":"user","content":"00000 "}]}`))
	var expired, full, overloaded, other atomic.Int64
	var errs sync.Map // first few unexpected answers, for the log
	var wg sync.WaitGroup
	began := time.Now()
	for i := range requests {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"m%d","messages":[{"role":"user","content":"%05d %s"}]}`, i%models+1, i, pad)
			resp, err := post(body)
			if err != nil {
				other.Add(1)
				errs.LoadOrStore(i%8, err.Error())
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "queue_timeout"):
				expired.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "1":
				full.Add(1)
			case front == "picker" && resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), `"overloaded"`):
				overloaded.Add(1) // past --max-buffered-bytes, before flow control
			default:
				other.Add(1)
				errs.LoadOrStore(i%8, fmt.Sprintf("%d Retry-After %q: %.200s", resp.StatusCode, resp.Header.Get("Retry-After"), b))
			}
		})
	}
	wg.Wait()
	answered := time.Since(began)
	during, held := pk.rss(), pk.metric(0)
	ended := time.Now()
	var after []string
	for _, at := range []time.Duration{time.Second, 5 * time.Second, 15 * time.Second} {
		time.Sleep(time.Until(ended.Add(at)))
		after = append(after, fmt.Sprintf("%v %d MB", at, rss()/1e6))
	}
	pk.stop()
	nowHeld := flowMetric(t, metrics, "exa_gateway_flow_queue_requests", "")
	outExpired := flowMetric(t, metrics, "exa_gateway_flow_requests_total", `outcome="expired"`)
	outFull := flowMetric(t, metrics, "exa_gateway_flow_requests_total", `outcome="rejected_full"`)
	// Over several models a request past the budget may displace another
	// model's (429 too, counted as displaced).
	outDisplaced := flowMetric(t, metrics, "exa_gateway_flow_requests_total", `outcome="displaced"`)
	release()
	for range models {
		require.NoError(t, <-first, "the held first request")
	}

	perHeld := 0.0
	if expired.Load() > 0 {
		perHeld = float64(during-start) / float64(expired.Load()) / 1e3
	}
	t.Logf("%s, %d requests of %d KiB over %d models (--flow-max-requests 4096, --flow-max-bytes 64 MiB, --flow-ttl %v): RSS %d MB before, peak %d MB (+%d MB, %.1f KB per held request); %d held then 503 queue_timeout, %d refused 429 (%.0f of them displaced), %d refused 503 overloaded (picker's --max-buffered-bytes), %d other; peak exa_gateway_flow_queue_requests %d; all answered in %v; after the last answer: %s",
		front, requests, bodySize>>10, models, ttl, start/1e6, during/1e6, (during-start)/1e6, perHeld,
		expired.Load(), full.Load(), outDisplaced, overloaded.Load(), other.Load(), held, answered.Round(time.Millisecond), strings.Join(after, ", "))
	errs.Range(func(k, v any) bool { t.Logf("unexpected answer: %v", v); return true })
	assert.Zero(t, other.Load(), "every request answered 503 queue_timeout, 429 with Retry-After or (picker) 503 overloaded")
	assert.Equal(t, int64(requests), expired.Load()+full.Load()+overloaded.Load(), "none lost")
	assert.Equal(t, float64(expired.Load()), outExpired, "expired as counted")
	assert.Equal(t, float64(full.Load()), outFull+outDisplaced, "refused full or displaced, as counted")
	if models == 1 {
		assert.Zero(t, outDisplaced, "one flow of one model: nothing to displace")
	}
	assert.Zero(t, nowHeld, "nothing left held")
	assert.LessOrEqual(t, held, int64(requests), "held past --flow-max-requests")
	if bodySize == 4<<10 {
		assert.Equal(t, int64(requests), expired.Load(), "every small request held: 16 MiB of bodies is within the 64 MiB")
	} else {
		assert.Positive(t, full.Load(), "96 MiB of bodies pass --flow-max-bytes")
	}
	assert.Less(t, during, int64(flowRSSBound), "peak RSS")
}

// flowMetric sums the samples of metric name at base (/metrics) whose
// labels contain match ("" all of them).
func flowMetric(t *testing.T, base, name, match string) float64 {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	re := regexp.MustCompile(`(?m)^` + name + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllSubmatch(b, -1) {
		if match != "" && !strings.Contains(string(m[1]), match) {
			continue
		}
		v, err := strconv.ParseFloat(string(m[2]), 64)
		require.NoError(t, err)
		sum += v
	}
	return sum
}

// startGatewayWith runs `exa serve gateway` with args and the routing
// config at cfg, and returns its base URL (from the start-up line) and
// the process.
func startGatewayWith(t *testing.T, cfg string, args ...string) (base string, proc *os.Process) {
	t.Helper()
	base, _, _, proc = startExa(t, exaBin, cfg, `gateway listening on (http://\S+) `, append([]string{"serve", "gateway"}, args...)...)
	return base, proc
}
