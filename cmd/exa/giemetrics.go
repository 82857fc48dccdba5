package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/examlops/gateway/fleet"
	"github.com/spf13/pflag"
)

// gieMetricFlags are GIE's engine metric flags (deprecated in GIE v1.5.0,
// which refuses them, but set by its chart for sglang, trtllm-serve and
// triton-tensorrt-llm pools) and the fleet.EngineMetrics field each sets.
var gieMetricFlags = []struct {
	name string
	dst  func(*fleet.EngineMetrics) *string
}{
	{"total-queued-requests-metric", func(m *fleet.EngineMetrics) *string { return &m.Queued }},
	{"total-running-requests-metric", func(m *fleet.EngineMetrics) *string { return &m.Running }},
	{"kv-cache-usage-percentage-metric", func(m *fleet.EngineMetrics) *string { return &m.KVUsage }},
	{"lora-info-metric", func(m *fleet.EngineMetrics) *string { return &m.LoRAInfo }},
	{"cache-info-metric", func(m *fleet.EngineMetrics) *string { return &m.CacheInfo }},
	{"model-server-metrics-path", func(m *fleet.EngineMetrics) *string { return &m.Path }},
}

// registerMetrics declares GIE's engine metric flags on f (hidden, as
// GIE deprecates them; docs/kubernetes.md lists them).
func (g *gieFlags) registerMetrics(f *pflag.FlagSet) {
	def := fleet.DefaultEngineMetrics()
	g.metrics = map[string]*string{}
	for _, m := range gieMetricFlags {
		g.metrics[m.name] = f.String(m.name, *m.dst(&def), "GIE: engine metric spec, name or name{label=value,...}; any of these flags reads every engine whose model names no --engine type with them (docs/kubernetes.md)")
		_ = f.MarkHidden(m.name) // deprecated in GIE; documented in docs/kubernetes.md
	}
	f.IntVar(&g.scrapePort, "model-server-metrics-port", 0, "GIE: port of the engines' metrics page (0 = each engine's serving port)")
	f.StringVar(&g.metricsScheme, "model-server-metrics-scheme", "http", "GIE: scheme of the engines' metrics page; only http is supported")
	_ = f.MarkHidden("model-server-metrics-port")
	_ = f.MarkHidden("model-server-metrics-scheme")
	f.DurationVar(&g.refreshMetrics, "refresh-metrics-interval", fleet.DefaultScrapeInterval, "GIE: same as --scrape-interval")
	// GIE's defaults (v1.5.0 pkg/epp/server/options.go): true, 5s, 2s.
	f.BoolVar(&g.metricsInsecure, "model-server-metrics-https-insecure-skip-verify", true, "GIE: accepted; only http metrics pages are scraped, so there is nothing to verify")
	_ = f.MarkHidden("model-server-metrics-https-insecure-skip-verify") // deprecated in GIE
	f.DurationVar(&g.refreshPool, "refresh-prometheus-metrics-interval", 5*time.Second, "GIE: accepted; the inference_pool_* series are computed when /metrics is scraped")
	f.DurationVar(&g.staleness, "metrics-staleness-threshold", 2*time.Second, "GIE: the inference_pool_average_* series count only engines whose metrics were scraped within this long")
}

// applyMetrics sets fl's engine metrics and scrape interval from GIE's
// metric flags.
func (g *gieFlags) applyMetrics(f *pflag.FlagSet, fl *pickerFlags) error {
	m, set := fleet.DefaultEngineMetrics(), false
	for _, mf := range gieMetricFlags {
		if !f.Changed(mf.name) {
			continue
		}
		v := *g.metrics[mf.name]
		if mf.name != "model-server-metrics-path" {
			if _, err := fleet.ParseMetricSpec(v); err != nil {
				return usagef("invalid --%s %q: %v", mf.name, v, err)
			}
		} else if v = strings.Trim(v, `"`); !strings.HasPrefix(v, "/") || strings.ContainsAny(v, "?# \t\r\n") {
			return usagef("invalid --%s %q: want an absolute path, no query", mf.name, *g.metrics[mf.name])
		}
		*mf.dst(&m), set = v, true
	}
	if f.Changed("model-server-metrics-port") {
		if g.scrapePort < 0 || g.scrapePort > 65535 {
			return usagef("invalid --model-server-metrics-port %q: want a port, 0-65535", fmt.Sprint(g.scrapePort))
		}
		m.Port, set = g.scrapePort, true
	}
	if g.metricsScheme != "http" {
		return usagef("invalid --model-server-metrics-scheme %q: only http is supported (engines' metrics pages are scraped in plaintext)", g.metricsScheme)
	}
	if set {
		g.engineMetrics = &m
	}
	for name, d := range map[string]time.Duration{"refresh-prometheus-metrics-interval": g.refreshPool, "metrics-staleness-threshold": g.staleness} {
		if d <= 0 {
			return usagef("invalid --%s %q: must be positive", name, d.String())
		}
	}
	fl.disc.staleness = g.staleness
	if f.Changed("refresh-metrics-interval") {
		if f.Changed("scrape-interval") {
			return usagef("invalid --refresh-metrics-interval %q: --scrape-interval is set too; use one", g.refreshMetrics.String())
		}
		if g.refreshMetrics <= 0 {
			return usagef("invalid --refresh-metrics-interval %q: must be positive", g.refreshMetrics.String())
		}
		fl.scrape = g.refreshMetrics
	}
	return nil
}
