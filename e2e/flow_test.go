//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
)

// Flow control end to end (issue 28): a noisy neighbour on real
// llm-d-inference-sim engines. Two engines of flowSeqs sequences each
// serve requests of flowTTFT to the first token and 5 to 25 tokens
// (flowTokens, varied per request as real answers are) flowITL apart,
// 0.8 s on average: the pool serves about 20 requests per second. A quiet
// tenant sends quietRate streamed requests per second, a flooding tenant
// floodRate (2.5 times the pool, 5 times its fair share), each with its
// own fairness id. Every front sheds at
// --shed-outstanding flowSeqs, so an engine never queues: the same rule
// decides "no room" with flow control on (the request waits in its
// queue) and off (it gets 429).
//
// Each test measures four phases of flowPhase: the quiet tenant alone;
// both tenants with flow control on (round-robin among flows, our
// default); both with flow control and global-strict fairness (GIE's
// default: oldest first, whatever the flow); both with flow control off
// (today's shedding). It logs each tenant's answers and TTFT.
// It asserts what must hold on any machine: no request lost (no answer,
// a cut stream, or a 5xx other than flow control's 503 queue_timeout),
// with flow control none of the quiet tenant's requests shed or timed out
// while the flooder's are (the pool was past capacity), the quiet
// tenant's p99 TTFT below its p99 without flow control or within
// flowSlack of its p99 alone, and nothing left in the queue after.
// docs/flow-control.md ("End to end with real engines") has the figures.

const (
	flowSeqs   = 8 // --max-num-seqs of each engine, and --shed-outstanding
	flowTTFT   = 500 * time.Millisecond
	flowITL    = 20 * time.Millisecond
	flowTokens = 5 // the fewest tokens of an answer; up to 20 more
	flowPhase  = 15 * time.Second
	quietRate  = 3.0  // requests per second
	floodRate  = 50.0 // requests per second
	flowTTL    = "5s" // --flow-ttl
	flowQueue  = "64" // --flow-max-requests
	// flowSlack bounds the quiet tenant's p99 TTFT with flow control, as a
	// factor of its p99 alone, when it is not below its p99 without flow
	// control: generous, for a loaded machine.
	flowSlack = 3.0
)

// flowSeqsArg is flowSeqs as a flag value.
var flowSeqsArg = strconv.Itoa(flowSeqs)

// flowFlags are the flags of the fronts with flow control on; both fronts
// also get shedFlags.
var (
	shedFlags = []string{"--shed-outstanding", flowSeqsArg}
	flowFlags = []string{"--flow-control", "--flow-ttl", flowTTL, "--flow-max-requests", flowQueue}
)

// flowPool starts the two engines and writes a routing configuration with
// them; it returns the configuration's path and the engines' URLs.
func flowPool(t *testing.T) (cfg string, engines []string) {
	t.Helper()
	cfg = filepath.Join(t.TempDir(), "routing.json")
	args := []string{"serve", "routing", "set", simModel, "--mode", "cache_aware"}
	for i := range 2 {
		port := freePort(t)
		s := startSim(t, port, []string{"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
			"--time-to-first-token", flowTTFT.String(), "--inter-token-latency", flowITL.String(),
			"--max-num-seqs", flowSeqsArg, "--max-model-len", "4096", "--zmq-endpoint=", "--seed", "1", "--v", "0"})
		engines = append(engines, s.url())
		args = append(args, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	exa(t, cfg, args...)
	return cfg, engines
}

// tenant is one client of a phase: its fairness id and request rate.
type tenant struct {
	id   string
	rate float64
}

// tally is a tenant's answers in one phase.
type tally struct {
	sent, ok, shed, timedOut, lost int
	ttft                           []time.Duration // of the answered requests
	why                            []string        // the first lost requests' answers
}

func (tl *tally) add(o flowOutcome) {
	tl.sent++
	switch {
	case o.netErr == nil && o.status == http.StatusOK && o.done && !o.errEvent:
		tl.ok++
		tl.ttft = append(tl.ttft, o.ttft)
	case o.netErr == nil && o.status == http.StatusTooManyRequests:
		tl.shed++
	case o.netErr == nil && o.status == http.StatusServiceUnavailable && o.code == "queue_timeout":
		tl.timedOut++
	default:
		tl.lost++
		if len(tl.why) < 5 {
			tl.why = append(tl.why, fmt.Sprintf("status %d code %q done %v error event %v: %v", o.status, o.code, o.done, o.errEvent, o.netErr))
		}
	}
}

func (tl *tally) String() string {
	ms := func(q float64) string { return fmt.Sprintf("%5.0f", float64(percentile(tl.ttft, q))/1e6) }
	return fmt.Sprintf("sent %4d  ok %4d  429 %4d  503 %4d  lost %d  TTFT ms p50 %s p90 %s p99 %s",
		tl.sent, tl.ok, tl.shed, tl.timedOut, tl.lost, ms(.5), ms(.9), ms(.99))
}

// flowOutcome is one streamed request's answer as its client saw it.
type flowOutcome struct {
	status   int
	code     string        // error.code of an error answer
	ttft     time.Duration // to the first SSE data line
	done     bool          // the stream ended with data: [DONE]
	errEvent bool          // an error event in the stream
	netErr   error
}

// flowChat sends one streamed chat request of tenant id to url.
func flowChat(ctx context.Context, url, id string, body []byte) flowOutcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return flowOutcome{netErr: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(flow.HeaderFairnessID, id)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return flowOutcome{netErr: err}
	}
	defer resp.Body.Close()
	o := flowOutcome{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		var eb struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &eb) == nil {
			o.code = eb.Error.Code
		}
		o.netErr = err
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if o.ttft == 0 {
			o.ttft = time.Since(start)
		}
		switch {
		case data == "[DONE]":
			o.done = true
		case strings.HasPrefix(data, `{"error"`):
			o.errEvent = true
		}
	}
	o.netErr = sc.Err()
	return o
}

// runTenants sends each tenant's requests to url at its rate (open loop,
// on a fixed schedule) for d, waits for every answer and returns each
// tenant's tally. Every request has its own prompt.
func runTenants(url string, d time.Duration, tenants ...tenant) map[string]*tally {
	out := map[string]*tally{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, tn := range tenants {
		tl := &tally{}
		out[tn.id] = tl
		n := int(tn.rate * d.Seconds())
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(start.Add(time.Duration(float64(i) / tn.rate * float64(time.Second)))))
				body := chatJSON(fmt.Sprintf("You are the assistant of tenant %s, conversation %d. ", tn.id, i)+words(tn.id, 40),
					"answer briefly", true, flowTokens+(i*13)%21)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				o := flowChat(ctx, url, tn.id, body)
				cancel()
				mu.Lock()
				tl.add(o)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return out
}

// flowArgs are the flags of a front with flow control: shedFlags,
// flowFlags, then extra.
func flowArgs(extra ...string) []string {
	return append(append(append([]string{}, shedFlags...), flowFlags...), extra...)
}

// flowFront is a front under test: its process (/metrics, /stats) and the
// URL its clients call.
type flowFront struct {
	*gatewayProc
	url string
}

// inFlight sums the replicas' in_flight in the front's /stats.
func (f flowFront) inFlight(t *testing.T) int {
	n := 0
	for _, m := range f.stats(t).Models {
		for _, r := range m.Replicas {
			n += r.InFlight
		}
	}
	return n
}

// noisyFronts are the fronts of a noisy-neighbour test, each routing over
// the same engines: on (flow control, round-robin among flows), strict
// (flow control with global-strict fairness, GIE's default: oldest
// first, whatever the flow) and off (shedding).
type noisyFronts struct{ on, strict, off flowFront }

// noisyNeighbour runs the phases on the fronts, which route over engines,
// and asserts and logs the results.
func noisyNeighbour(t *testing.T, name string, fr noisyFronts, engines []string) {
	for _, f := range []flowFront{fr.on, fr.strict, fr.off} {
		for _, e := range engines {
			waitFor(t, 20*time.Second, name+" to admit "+e, func() bool { h, _ := f.engineHealthy(t, e); return h })
		}
		for i := range 4 { // warm connections
			o := flowChat(context.Background(), f.url, "warm", chatJSON(fmt.Sprintf("warm-up %d", i), "hi", true, 2))
			require.Equal(t, http.StatusOK, o.status, "warm-up through %s", f.url)
		}
	}
	quiet, flood := tenant{"quiet", quietRate}, tenant{"flood", floodRate}
	// Every client has its answer when a phase ends: the front's count
	// of requests in flight is back to 0 soon after.
	settle := func(f flowFront, phase string) {
		waitFor(t, 20*time.Second, name+" idle after "+phase, func() bool { return f.inFlight(t) == 0 })
	}
	settle(fr.on, "warm-up")
	start := time.Now()
	alone := runTenants(fr.on.url, flowPhase, quiet)
	settle(fr.on, "alone")
	withFlow := runTenants(fr.on.url, flowPhase, quiet, flood)
	t.Logf("flow control: quiet %v; flood %v", withFlow["quiet"], withFlow["flood"])
	settle(fr.on, "flow control")
	strict := runTenants(fr.strict.url, flowPhase, quiet, flood)
	t.Logf("flow control strict: quiet %v; flood %v", strict["quiet"], strict["flood"])
	settle(fr.strict, "flow control strict")
	without := runTenants(fr.off.url, flowPhase, quiet, flood)
	settle(fr.off, "shedding")

	t.Logf("%s, 2 engines x %d sequences, TTFT %v + %d-%d tokens x %v; quiet %.0f req/s, flood %.0f req/s, %v per phase (%v in all); --shed-outstanding %d; flow control: %s",
		name, flowSeqs, flowTTFT, flowTokens, flowTokens+20, flowITL, quietRate, floodRate, flowPhase, time.Since(start).Round(time.Second),
		flowSeqs, strings.Join(flowFlags, " "))
	t.Logf("quiet alone                           %v", alone["quiet"])
	t.Logf("quiet, flood, flow control            %v", withFlow["quiet"])
	t.Logf("flood, flow control                   %v", withFlow["flood"])
	t.Logf("quiet, flood, flow control strict     %v", strict["quiet"])
	t.Logf("flood, flow control strict            %v", strict["flood"])
	t.Logf("quiet, flood, shedding                %v", without["quiet"])
	t.Logf("flood, shedding                       %v", without["flood"])
	for _, f := range []struct {
		name string
		f    flowFront
	}{{"round-robin", fr.on}, {"global-strict", fr.strict}} {
		var b strings.Builder
		for _, o := range []string{front.FlowDispatched, front.FlowFull, front.FlowDisplaced, front.FlowExpired, front.FlowClientGone} {
			fmt.Fprintf(&b, " %s %v", o, f.f.metric(t, "exa_gateway_flow_requests_total", map[string]string{"outcome": o}))
		}
		t.Logf("exa_gateway_flow_requests_total, %s:%s", f.name, b.String())
	}

	for phase, m := range map[string]map[string]*tally{"alone": alone, "flow control": withFlow, "flow control strict": strict, "shedding": without} {
		for id, tl := range m {
			require.Zero(t, tl.lost, "%s, %s: requests lost: %v", phase, id, tl.why)
		}
	}
	require.Equal(t, alone["quiet"].sent, alone["quiet"].ok, "alone, every quiet request is served")
	q := withFlow["quiet"]
	require.Equal(t, q.sent, q.ok, "flow control: none of the quiet tenant's requests shed or timed out")
	fl := withFlow["flood"]
	require.Positive(t, fl.shed+fl.timedOut, "flow control: the flooder took the pool past capacity")
	require.Positive(t, fl.ok, "flow control: the flooder is served what the pool leaves")
	require.Positive(t, without["flood"].shed, "shedding: the flooder took the pool past capacity")
	require.Positive(t, without["quiet"].shed, "shedding: the quiet tenant is shed too (the case flow control is for)")
	p99, p99off, p99alone := percentile(q.ttft, .99), percentile(without["quiet"].ttft, .99), percentile(alone["quiet"].ttft, .99)
	require.True(t, p99 < p99off || float64(p99) <= flowSlack*float64(p99alone),
		"quiet p99 TTFT with flow control %v: neither below its p99 with shedding (%v) nor within %.0fx its p99 alone (%v)", p99, p99off, flowSlack, p99alone)
	for _, f := range []flowFront{fr.on, fr.strict} {
		require.Zero(t, f.metric(t, "exa_gateway_flow_queue_requests", nil), "nothing left in the queue")
	}
}

// TestFlowNoisyNeighbourGateway runs the noisy neighbour through
// `exa serve gateway`.
func TestFlowNoisyNeighbourGateway(t *testing.T) {
	requireBinaries(t)
	cfg, engines := flowPool(t)
	on := startGateway(t, cfg, flowArgs()...)
	strict := startGateway(t, cfg, flowArgs("--flow-fairness", "global-strict")...)
	off := startGateway(t, cfg, shedFlags...)
	noisyNeighbour(t, "gateway", noisyFronts{flowFront{on, on.url}, flowFront{strict, strict.url}, flowFront{off, off.url}}, engines)
}

// TestFlowNoisyNeighbourPicker runs the noisy neighbour through
// `exa serve picker` behind the test's Envoy (pickertest.Envoy), as
// TestPicker does: the picker holds the ext_proc stream while the request
// waits.
func TestFlowNoisyNeighbourPicker(t *testing.T) {
	requireBinaries(t)
	cfg, engines := flowPool(t)
	on := startPickerProc(t, "picker-flow", cfg, flowArgs()...)
	strict := startPickerProc(t, "picker-strict", cfg, flowArgs("--flow-fairness", "global-strict")...)
	off := startPickerProc(t, "picker-shed", cfg, shedFlags...)
	noisyNeighbour(t, "picker", noisyFronts{flowFront{on.gatewayProc, on.envoy(t, false)}, flowFront{strict.gatewayProc, strict.envoy(t, false)},
		flowFront{off.gatewayProc, off.envoy(t, false)}}, engines)
}
