//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPeersSharedTTFTMeasure measures, on real engines, what two gateways
// sharing the traffic gain by sharing their pending prefill
// (EXA_MEASURE=1; docs/multi-gateway.md). Four llm-d-inference-sim
// engines serve one request at a time (--max-num-seqs 1), 0.5 ms a prompt
// token, so a request waits for the prefill queued before it; every
// prompt is new (100 to 2,000 words), so cache_aware routes by the
// prefill pending at each engine. Two exa gateways, engines scraped every
// second, each get a random half of an open-loop stream; each setting
// runs the same stream: no peers, peers on the engines' clock (1 s), and
// peers every 100 ms (the default). TTFT is the client's, to the first
// SSE data line.
//
//	EXA_MEASURE=1 bash e2e/run.sh -run TestPeersSharedTTFTMeasure -v
//
// (EXA_REVERSE=1 runs the settings in the other order.)
func TestPeersSharedTTFTMeasure(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	requireBinaries(t)
	const engines, requests = 4, 300
	var reps []string
	for i := range engines {
		port := freePort(t)
		s := startSim(t, port, append(simArgs(port, 8192, 500*time.Microsecond), "--max-num-seqs", "1"))
		reps = append(reps, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	// The stream: arrival times and prompts, the same for every setting.
	rng := rand.New(rand.NewPCG(7, 7))
	gap := time.Second * 10 / 53 // 5.3 a second: about 70% of the engines' capacity (4 / 0.525 s) at a mean of 1,050 one-token words
	type req struct {
		at   time.Duration
		gw   int
		body []byte
	}
	stream := make([]req, requests)
	var at time.Duration
	for i := range stream {
		at += time.Duration(rng.ExpFloat64() * float64(gap))
		words := 100 + rng.IntN(1901)
		// A word of its own first, so that no block is cached anywhere,
		// then one-token words.
		var b strings.Builder
		fmt.Fprintf(&b, "request%d", i)
		b.WriteString(strings.Repeat(" a", words-1))
		stream[i] = req{at: at, gw: rng.IntN(2), body: chatJSON("", b.String(), true, 1)}
	}
	type setting struct {
		name  string
		peers bool
		every time.Duration
	}
	sets := []setting{{"no peers", false, 0}, {"peers every 1s", true, time.Second}, {"peers every 100ms", true, 100 * time.Millisecond}}
	if os.Getenv("EXA_REVERSE") != "" { // the settings in the other order, to see what order does
		slices.Reverse(sets)
	}
	// Whatever runs first on fresh engines is slower (about 790 ms mean
	// against 540-575 ms, in either order): a run first, not counted.
	sets = append([]setting{{"warm-up, not counted", false, 0}}, sets...)
	for _, set := range sets {
		portA, portB := freePort(t), freePort(t)
		urls := []string{"http://127.0.0.1:" + strconv.Itoa(portA), "http://127.0.0.1:" + strconv.Itoa(portB)}
		var gws []*gatewayProc
		for i, port := range []int{portA, portB} {
			cfg := filepath.Join(t.TempDir(), fmt.Sprintf("gw%d.json", i))
			args := append([]string{"serve", "routing", "set", simModel, "--mode", "cache_aware"}, reps...)
			if set.peers {
				args = append(args, "--peer", urls[1-i])
			}
			exa(t, cfg, args...)
			name := fmt.Sprintf("gw%d-%s", i, strings.ReplaceAll(set.name, " ", "-"))
			p := startProc(t, name, []string{"EXA_CONFIG=" + cfg}, exaBin, "serve", "gateway",
				"--listen", "127.0.0.1:"+strconv.Itoa(port), "--scrape-interval", "1s", "--peer-scrape-interval", max(set.every, 100*time.Millisecond).String())
			g := &gatewayProc{url: urls[i], p: p}
			waitFor(t, 20*time.Second, name+" /healthz", func() bool { return get(g.url+"/healthz") == 200 })
			gws = append(gws, g)
		}
		time.Sleep(2 * time.Second) // a first scrape of every engine and peer
		ttfts := make([]time.Duration, requests)
		var failed int
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for i, r := range stream {
			time.Sleep(time.Until(start.Add(r.at)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := flowChat(context.Background(), urls[r.gw], "m", r.body)
				mu.Lock()
				defer mu.Unlock()
				if o.status != 200 || !o.done || o.netErr != nil {
					if failed < 3 {
						t.Logf("%s: request %d: status %d code %q done %v err %v", set.name, i, o.status, o.code, o.done, o.netErr)
					}
					failed++
					return
				}
				ttfts[i] = o.ttft
			}()
		}
		wg.Wait()
		for _, g := range gws {
			g.p.kill()
		}
		require.Zero(t, failed, "%s: failed requests", set.name)
		slices.Sort(ttfts)
		var sum time.Duration
		for _, d := range ttfts {
			sum += d
		}
		t.Logf("%-18s mean TTFT %6.0f ms, p50 %6.0f ms, p90 %6.0f ms, p99 %6.0f ms (%d requests over %.0f s)", set.name,
			float64(sum.Milliseconds())/requests, ms(ttfts[requests/2]), ms(ttfts[requests*9/10]), ms(ttfts[requests*99/100]), requests, time.Since(start).Seconds())
		time.Sleep(3 * time.Second) // the engines drain
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
