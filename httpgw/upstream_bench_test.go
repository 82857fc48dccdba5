package httpgw

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/prometheus/client_golang/prometheus"
)

// benchTransports are the engine transports BenchmarkTransport compares.
func benchTransports() []struct {
	name string
	rt   func() http.RoundTripper
} {
	return []struct {
		name string
		rt   func() http.RoundTripper
	}{
		{"connpool", func() http.RoundTripper { return httpclient.New(httpclient.Options{}) }},
		{"transport", func() http.RoundTripper { return httpclient.NewTransport(0) }},
	}
}

// streamEngine answers every inference request with an SSE stream of
// chunks events, each flushed on its own.
func streamEngine(chunks int) *httptest.Server {
	ev := []byte(`data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n")
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range chunks {
			_, _ = w.Write(ev)
			_ = rc.Flush()
		}
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
	}))
}

// BenchmarkTransport is the A/B of the engine transports: the whole
// handler path (parse, key, route, forward over loopback to a net/http
// engine, relay) with each transport, for a small JSON answer and a
// streamed one, called directly ("handler") and through a net/http front
// server and client ("hop", the latency a client sees), sequentially and
// from parallel clients. Run it interleaved, e.g.
//
//	go test -c -o /tmp/gw.test ./httpgw
//	for i in $(seq 10); do /tmp/gw.test -test.run '^$' -test.bench BenchmarkTransport -test.benchmem; done > ab.txt
//	benchstat -col /transport ab.txt
func BenchmarkTransport(b *testing.B) {
	engines := []struct {
		name string
		srv  *httptest.Server
	}{{"answer=json", benchEngine()}, {"answer=sse8", streamEngine(8)}}
	for _, e := range engines {
		defer e.srv.Close()
	}
	for _, e := range engines {
		for _, mode := range []string{"handler", "hop", "hop-parallel"} {
			for _, tr := range benchTransports() {
				b.Run(e.name+"/path="+mode+"/transport="+tr.name, func(b *testing.B) {
					rt := tr.rt()
					s := benchServer(b, rt, e.srv.URL)
					defer s.Close()
					if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
						defer c.CloseIdleConnections()
					}
					switch mode {
					case "handler":
						benchHandlerLoop(b, s)
					case "hop":
						benchHopLoop(b, s, false)
					default:
						benchHopLoop(b, s, true)
					}
				})
			}
		}
	}
}

// benchHandlerLoop calls s's handler in turn with benchBody.
func benchHandlerLoop(b *testing.B, s *Server) {
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchBody))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// benchHopLoop sends benchBody through a net/http front server in front
// of s, from one client or (parallel) from 4 per GOMAXPROCS.
func benchHopLoop(b *testing.B, s *Server, parallel bool) {
	gw := httptest.NewServer(s)
	defer gw.Close()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	defer c.CloseIdleConnections()
	b.ReportAllocs()
	if !parallel {
		for b.Loop() {
			benchCall(b, c, gw.URL)
		}
		return
	}
	var failed atomic.Value
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Post(gw.URL+"/v1/chat/completions", "application/json", bytes.NewReader(benchBody))
			if err != nil {
				failed.Store(err.Error())
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Store("status " + strconv.Itoa(resp.StatusCode))
				return
			}
		}
	})
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
}

// BenchmarkTransportPaired compares the transports request by request:
// each iteration sends one request through a gateway on each transport,
// in alternating order, through a net/http front server (the hop a client
// sees), and the benchmark reports each transport's median latency, the
// median of the paired differences (connpool − transport) and the share of
// pairs the pool won, so that drifts in the machine's load, which swamp
// BenchmarkTransport's sequential runs on a shared machine, cancel out.
// Engine, gateway and client share one Go runtime here, where the
// latencies are bimodal (goroutine wake-ups): on a loaded machine each
// series' own median can favour either transport while the paired
// difference favours the pool. The decisive measure is the e2e latency
// test, with the engine and the gateway in processes of their own:
//
//	EXA_E2E_LATENCY_BASELINE_EXA=$(which exa) EXA_E2E_LATENCY_BASELINE_ARGS=--engine-client=std bash e2e/run.sh -run TestAddedLatency
func BenchmarkTransportPaired(b *testing.B) {
	engines := []struct {
		name string
		srv  *httptest.Server
	}{{"answer=json", benchEngine()}, {"answer=sse8", streamEngine(8)}}
	for _, e := range engines {
		defer e.srv.Close()
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			trs := benchTransports()
			urls := make([]string, len(trs))
			for i, tr := range trs {
				rt := tr.rt()
				s := benchServer(b, rt, e.srv.URL)
				defer s.Close()
				gw := httptest.NewServer(s)
				defer gw.Close()
				urls[i] = gw.URL
			}
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
			defer c.CloseIdleConnections()
			lat := make([][]time.Duration, len(trs))
			i := 0
			for b.Loop() {
				for k := range trs {
					j := k
					if i%2 == 1 {
						j = len(trs) - 1 - k
					}
					start := time.Now()
					benchCall(b, c, urls[j])
					lat[j] = append(lat[j], time.Since(start))
				}
				i++
			}
			b.StopTimer()
			diff := make([]time.Duration, len(lat[0]))
			for n := range diff {
				diff[n] = lat[0][n] - lat[1][n]
			}
			for k, tr := range trs {
				b.ReportMetric(float64(median(lat[k]).Nanoseconds()), "ns-p50-"+tr.name)
			}
			b.ReportMetric(float64(median(diff).Nanoseconds()), "ns-p50-diff")
			faster := 0
			for _, d := range diff {
				if d < 0 {
					faster++
				}
			}
			b.ReportMetric(float64(faster)/float64(max(len(diff), 1)), "frac-connpool-faster")
			b.ReportMetric(0, "ns/op") // the pair's time is not the figure
		})
	}
}

// median returns the median of d (which it sorts).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkUpstreamStream is the handler path (parse, key, route, forward
// to a loopback engine that streams 64 chunks, answer) for a non-streamed
// request, with UpstreamStream on (assembled JSON answer) and off (the
// same stream relayed as it is): the cost of aggregation on the whole
// path.
func BenchmarkUpstreamStream(b *testing.B) {
	eng := streamEngine(64)
	defer eng.Close()
	for _, mode := range []UpstreamStreamMode{UpstreamStreamOff, UpstreamStreamOn} {
		name := map[UpstreamStreamMode]string{UpstreamStreamOff: "off", UpstreamStreamOn: "on"}[mode]
		b.Run("upstream-stream="+name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), UpstreamStream: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.Apply(&config.File{Version: 1, Models: map[string]config.Model{"m1": {Mode: gateway.ModeCacheAware,
				Replicas: []config.Replica{{Name: "e0", Address: eng.URL}}}}}); err != nil {
				b.Fatal(err)
			}
			benchHandlerLoop(b, s)
		})
	}
}
