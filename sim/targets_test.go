package sim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// targetCase is one setting of issue 9's checklist.
type targetCase struct {
	name     string
	w        Workload
	replicas int
	preset   string
}

// checkTargets returns issue 9's targets for cache_aware on one report, one
// line each, and how many were missed.
func checkTargets(rep *Report) (lines []string, missed int) {
	me, _ := rep.Result("cache_aware")
	rr, _ := rep.Result("round_robin")
	mark := func(ok bool) string {
		if ok {
			return "met "
		}
		missed++
		return "MISS"
	}
	// p99s come from 1%-wide buckets: equal ones are a tie at that
	// resolution, reported as such (and counted as missed).
	p99mark := func(me, other float64) string {
		if me == other {
			missed++
			return "tie "
		}
		return mark(me < other)
	}
	bestMean, bestP99 := Result{}, Result{}
	bestPeer := Result{}
	for _, x := range rep.Results {
		if x.Policy == me.Policy {
			continue
		}
		if bestMean.Policy == "" || x.TTFT.Mean < bestMean.TTFT.Mean {
			bestMean = x
		}
		if bestP99.Policy == "" || x.TTFT.P99 < bestP99.TTFT.P99 {
			bestP99 = x
		}
		if isPeer(x.Policy) && (bestPeer.Policy == "" || x.TTFT.Mean < bestPeer.TTFT.Mean) {
			bestPeer = x
		}
	}
	frac := me.TokenHitRate / rep.PooledLRU.TokenHitRate
	loaded := rr.TTFT.Mean > 2*rep.Ideal.Mean
	lines = append(lines,
		fmt.Sprintf("%s lowest mean TTFT: %s vs next %s %s", mark(me.TTFT.Mean < bestMean.TTFT.Mean), ms(me.TTFT.Mean), bestMean.Policy, ms(bestMean.TTFT.Mean)),
		fmt.Sprintf("%s lowest p99 TTFT: %s vs next %s %s", p99mark(me.TTFT.P99, bestP99.TTFT.P99), sec(me.TTFT.P99), bestP99.Policy, sec(bestP99.TTFT.P99)),
		fmt.Sprintf("%s imbalance %.2f (<= 1.15)", mark(me.Imbalance <= 1.15), me.Imbalance),
		fmt.Sprintf("%s token hit %.1f%% = %.1f%% of pooled LRU %.1f%% (>= 95%%)", mark(frac >= 0.95), 100*me.TokenHitRate, 100*frac, 100*rep.PooledLRU.TokenHitRate),
	)
	if loaded {
		lines = append(lines, fmt.Sprintf("%s loaded (round-robin %.2f× ideal): mean %.2f× best peer %s %s (<= 0.90)",
			mark(me.TTFT.Mean <= 0.9*bestPeer.TTFT.Mean), rr.IdealRatio, me.TTFT.Mean/bestPeer.TTFT.Mean, bestPeer.Policy, sec(bestPeer.TTFT.Mean)))
	} else {
		lines = append(lines, fmt.Sprintf("n/a  not loaded (round-robin %.2f× ideal): mean %.2f× best peer %s", rr.IdealRatio, me.TTFT.Mean/bestPeer.TTFT.Mean, bestPeer.Policy))
	}
	return lines, missed
}

// ms formats seconds as milliseconds to 0.1 ms.
func ms(s float64) string { return fmt.Sprintf("%.1fms", 1000*s) }

// isPeer reports whether a default policy is a router from the field.
func isPeer(name string) bool {
	for _, p := range DefaultPolicies() {
		if p.Name == name {
			return p.Source != ""
		}
	}
	return false
}

func targetCases(t *testing.T) []targetCase {
	var cs []targetCase
	for _, preset := range []string{"8b-h100", "8b-h100-blis"} {
		if _, err := os.Stat(mooncakePath); err == nil {
			for _, speed := range []float64{1, 2} {
				w, err := TraceFile(mooncakePath, TraceOptions{Speed: speed})
				require.NoError(t, err)
				for _, n := range []int{4, 8, 16, 32} {
					cs = append(cs, targetCase{fmt.Sprintf("mooncake ×%g", speed), w, n, preset})
				}
			}
		}
		for _, name := range WorkloadNames() {
			w, err := NewWorkload(name, 0, 0)
			require.NoError(t, err)
			cs = append(cs, targetCase{name, w, DefaultReplicas, preset})
		}
	}
	return cs
}

// TestIssue9Targets runs issue 9's checklist (cache-aware against every
// policy on the Mooncake trace at 4, 8, 16 and 32 replicas, recorded speed
// and ×2, both 8B presets, and on every generated workload) and logs each
// table and target. It is slow, so it runs only when EXA_TARGETS is set:
//
//	EXA_TARGETS=1 go test ./sim -run TestIssue9Targets -v -timeout 1h
//
// and with EXA_STREAMED=0 with no client streaming (see Config.NonStreamed).
//
// It reports; it does not fail on a missed target (docs/results.md
// states them), only on a broken run.
func TestIssue9Targets(t *testing.T) {
	if os.Getenv("EXA_TARGETS") == "" {
		t.Skip("set EXA_TARGETS=1 to run the checklist")
	}
	old := checkInvariants
	checkInvariants = false
	defer func() { checkInvariants = old }()
	// EXA_STREAMED, a share 0..1, runs with that share of clients
	// streaming (exa simulate --streamed); unset, all stream. The others'
	// first tokens are heard at completion (--upstream-stream=false),
	// unless EXA_UPSTREAM=1; EXA_RELEASE=1 releases their pending prefill
	// at its predicted end (--predicted-release). EXA_CACHE_AT_SCHEDULE=1
	// runs the engines with Config.CacheAtSchedule (--cache-at-schedule).
	nonStreamed := 0.0
	if v := os.Getenv("EXA_STREAMED"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		nonStreamed = 1 - f
	}
	var summary, compact strings.Builder
	total := 0
	for _, c := range targetCases(t) {
		rep, err := Run(Config{Workload: c.w, Replicas: c.replicas, Preset: MustPreset(c.preset), Seed: 1, NonStreamed: nonStreamed,
			UpstreamStream: os.Getenv("EXA_UPSTREAM") == "1", PredictedRelease: os.Getenv("EXA_RELEASE") == "1",
			CacheAtSchedule: os.Getenv("EXA_CACHE_AT_SCHEDULE") == "1"})
		require.NoError(t, err)
		var b strings.Builder
		require.NoError(t, rep.WriteTable(&b))
		lines, missed := checkTargets(rep)
		total += missed
		t.Logf("%s, %d replicas, %s:\n%s%s\n", c.name, c.replicas, c.preset, b.String(), strings.Join(lines, "\n"))
		fmt.Fprintf(&summary, "| %s | %d | %s | %s |\n", c.name, c.replicas, c.preset, strings.Join(lines, "<br>"))
		compact.WriteString(compactRow(rep, c))
	}
	t.Logf("%d targets missed\n| workload | replicas | preset | targets |\n|---|---|---|---|\n%s", total, summary.String())
	t.Logf("summary\n| workload | replicas | preset | ideal mean | cache_aware mean (×ideal) / p99 | best peer mean / p99 | round_robin mean | cache_aware imbalance, hit / pooled |\n|---|---|---|---|---|---|---|---|\n%s", compact.String())
}

// compactRow is one line of the summary: cache_aware beside the best peer
// (by mean TTFT) and round-robin.
func compactRow(rep *Report, c targetCase) string {
	me, _ := rep.Result("cache_aware")
	rr, _ := rep.Result("round_robin")
	var peer Result
	for _, x := range rep.Results {
		if isPeer(x.Policy) && (peer.Policy == "" || x.TTFT.Mean < peer.TTFT.Mean) {
			peer = x
		}
	}
	return fmt.Sprintf("| %s | %d | %s | %s | %s (%.2f) / %s | %s %s / %s | %s | %.2f, %.1f%% / %.1f%% |\n",
		c.name, c.replicas, c.preset, sec(rep.Ideal.Mean), sec(me.TTFT.Mean), me.IdealRatio, sec(me.TTFT.P99),
		peer.Policy, sec(peer.TTFT.Mean), sec(peer.TTFT.P99), sec(rr.TTFT.Mean), me.Imbalance, 100*me.TokenHitRate, 100*rep.PooledLRU.TokenHitRate)
}
