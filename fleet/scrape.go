package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/budget"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ErrScrape reports an engine /metrics page that could not be fetched or
// parsed.
var ErrScrape = errors.New("gateway: scrape engine metrics")

// maxMetricsBytes bounds the /metrics page read from an engine.
const maxMetricsBytes = 8 << 20

// maxErrorBytes bounds the text of a page's parse error kept in a scrape
// error: the parser quotes the token it fails on, up to a whole line of
// the page, and the error is kept per engine (/stats) and logged.
const maxErrorBytes = 256

// ParseEngineMetrics parses a Prometheus text exposition, as an engine
// serves it at /metrics, into a gateway.Load, detecting the engine's type
// from the names on the page (see ParseEngineMetricsFor with
// config.EngineAuto). A page that does not parse is an error wrapping
// ErrScrape.
func ParseEngineMetrics(r io.Reader) (gateway.Load, error) {
	l, _, err := ParseEngineMetricsFor(r, config.EngineAuto)
	return l, err
}

// ParseEngineMetricsFor parses an engine's /metrics page into a
// gateway.Load with the metric names of engine type engine (a
// config.Engines value; config.EngineAuto tries them in that order and
// takes the first whose load series the page has). It also returns the
// type whose series it found, "" when the page has none of that type's
// (or, for auto, of any type's) series: the load then reads as zero.
//
// QueueDepth is the sum of the waiting series (vllm:num_requests_waiting,
// sglang:num_queue_reqs, nv_trt_llm_request_metrics{request_type="waiting"})
// over their series (one per model, rank or GPU; of SGLang's, the totals,
// priority="" or no priority label, not their breakdown by priority),
// Running the sum of the
// running ones (vllm:num_requests_running, sglang:num_running_reqs,
// nv_trt_llm_request_metrics{request_type="scheduled"}), KVUtilization the
// largest KV-cache usage (vllm:kv_cache_usage_perc, or from older vLLM
// versions vllm:gpu_cache_usage_perc; sglang:token_usage;
// nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}),
// clamped to 0..1. Missing series read as zero; Latency is left zero so the
// gateway keeps its own measurement. Counts are clamped to 0..MaxLoadCount.
// The names are those of GIE's model-server protocol table
// (docs/proposals/003-model-server-protocol/README.md). A page that does
// not parse, or an unknown engine type, is an error wrapping ErrScrape.
func ParseEngineMetricsFor(r io.Reader, engine string) (gateway.Load, string, error) {
	res, err := parseEngineScrapeAs(r, engine, nil)
	if err != nil {
		return gateway.Load{}, "", fmt.Errorf("%w: %v", ErrScrape, err)
	}
	return res.load, res.engine, nil
}

// MaxLoadCount is the largest request count ParseEngineMetrics reports;
// larger (or absurd) values are clamped to it, so that they cannot wrap
// around to a negative or small count and make a busy engine look idle.
const MaxLoadCount = 1 << 30

// parseEngineScrape parses an engine's /metrics page, detecting its type,
// into its load and, when it exposes vllm:lora_requests_info, its adapter
// report (else nil; see parseLoRAInfo).
func parseEngineScrape(r io.Reader) (gateway.Load, *gateway.AdapterReport, error) {
	res, err := parseEngineScrapeAs(r, config.EngineAuto, nil)
	return res.load, res.adapters, err
}

// scrapeResult is what one engine's /metrics page says.
type scrapeResult struct {
	load gateway.Load
	// adapters is the engine's vllm:lora_requests_info report, nil
	// without one.
	adapters *gateway.AdapterReport
	// engine is the engine type whose load series the page has, "" when
	// none (see ParseEngineMetricsFor).
	engine string
	// kvTokens is the KV-cache size the page reports, in tokens
	// (parseKVTokens), 0 when none.
	kvTokens int64
}

// parseEngineScrapeAs parses an engine's /metrics page with the names of
// engine type engine; config.EngineAuto detects it or, when custom is not
// nil, reads custom's names (Options.EngineMetrics).
func parseEngineScrapeAs(r io.Reader, engine string, custom *customNames) (scrapeResult, error) {
	var res scrapeResult
	if _, err := config.ParseEngine(engine); err != nil {
		return res, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return res, err
	}
	if engine == config.EngineAuto && custom != nil {
		if custom.lora != nil {
			if a, ok := parseLoRAInfo(custom.lora.only(fams[custom.lora.family])); ok {
				res.adapters = &a
			}
		}
		if custom.cache != nil {
			res.kvTokens = parseKVTokens(fams, []cacheInfo{*custom.cache})
		}
		if custom.load.present(fams) {
			res.load, res.engine = custom.load.load(fams), EngineCustom
		}
		return res, nil
	}
	if a, ok := parseLoRAInfo(fams[metricLoRAInfo]); ok {
		res.adapters = &a
	}
	res.kvTokens = parseKVTokens(fams, cacheInfos)
	for _, n := range engineNames {
		if (engine == config.EngineAuto || engine == n.engine) && n.present(fams) {
			res.load, res.engine = n.load(fams), n.engine
			break
		}
	}
	return res, nil
}

// loadCount rounds a scraped count and clamps it to 0..MaxLoadCount
// before converting it, so no float is out of int's range.
func loadCount(v float64) int {
	return int(math.Round(min(max(v, 0), MaxLoadCount)))
}

// sampleValue returns the value of a gauge, counter or untyped sample; NaN
// and infinities read as zero.
func sampleValue(m *dto.Metric) float64 {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// defaultFamilyNames lists the families an engine's scrape reads without
// Options.EngineMetrics: every engine type's load series, KV-cache size
// and vLLM's adapter report.
func defaultFamilyNames() []string {
	names := []string{metricLoRAInfo}
	for _, n := range engineNames {
		names = append(names, n.waiting.family, n.running.family)
		for _, k := range n.kv {
			names = append(names, k.family)
		}
	}
	for _, c := range cacheInfos {
		names = append(names, c.family)
	}
	return names
}

// defaultFamilies is defaultFamilyNames' familySet.
var defaultFamilies = newFamilySet(defaultFamilyNames()...)

// pageFamilies returns the families a scrape with custom's names keeps
// of an engine's page (all the default ones too).
func (c *customNames) pageFamilies() familySet {
	if c == nil {
		return defaultFamilies
	}
	return c.fams
}

// scrape fetches and parses one engine's metrics page with the names of
// engine type engine (config.EngineAuto detects it, or reads custom's
// names when custom is not nil); the page is custom's path and port, else
// /metrics on the engine's port. Only the lines of the families read are
// parsed (filterFamilies), charged to b while the page is read.
func scrape(ctx context.Context, client *http.Client, base, engine string, custom *customNames, b *budget.Budget) (scrapeResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, custom.metricsURL(base), nil)
	if err != nil {
		return scrapeResult{}, fmt.Errorf("%w: %s: %v", ErrScrape, base, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return scrapeResult{}, fmt.Errorf("%w: %s: %v", ErrScrape, base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return scrapeResult{}, fmt.Errorf("%w: %s: status %d", ErrScrape, base, resp.StatusCode)
	}
	h := budget.Hold{B: b}
	defer h.Release()
	res, err := parseEngineScrapeAs(filterFamilies(resp.Body, custom.pageFamilies(), &h), engine, custom)
	if err != nil {
		return scrapeResult{}, fmt.Errorf("%w: %s: parse: %s", ErrScrape, base, clipError(err))
	}
	return res, nil
}

// clipError returns err's text, at most maxErrorBytes of it (cut at a
// character, "..." added).
func clipError(err error) string {
	msg := err.Error()
	if len(msg) <= maxErrorBytes {
		return msg
	}
	return strings.ToValidUTF8(msg[:maxErrorBytes], "") + "..."
}
