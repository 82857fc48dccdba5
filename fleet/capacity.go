package fleet

import (
	"context"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"

	"github.com/examlops/gateway/kvevents"
)

// cacheInfo names an engine's cache-configuration info series and the
// labels that carry its KV-cache size: number of blocks and tokens a
// block. Names from GIE v1.5.0's metrics extractor defaults
// (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go,
// defaultEngineConfigs: vLLM's CacheInfoSpec, SGLang's with its label
// names), the series GIE's approximate prefix index sizes its per-pod LRU
// by (approximateprefix/plugin.go, AutoTune, the default).
type cacheInfo struct {
	family, blocks, blockSize string
	// labels select the samples read (EngineMetrics.CacheInfo); none: all.
	labels []labelValue
}

var cacheInfos = []cacheInfo{
	{family: "vllm:cache_config_info", blocks: "num_gpu_blocks", blockSize: "block_size"},
	{family: "sglang:cache_config_info", blocks: "num_pages", blockSize: "page_size"},
}

// maxKVTokens bounds an engine's reported KV-cache size in tokens: far
// beyond any engine (2^40 tokens), small enough that block arithmetic on
// it cannot overflow.
const maxKVTokens = 1 << 40

// parseKVTokens returns the KV-cache size in tokens that a /metrics page
// reports (blocks × tokens a block, from the first of infos present; the largest when several samples), or 0 when it reports none
// or a size that is not a positive integer of at most maxKVTokens.
func parseKVTokens(fams map[string]*dto.MetricFamily, infos []cacheInfo) int64 {
	for _, ci := range infos {
		f := fams[ci.family]
		if f == nil {
			continue
		}
		var best int64
		sel := series{family: ci.family, labels: ci.labels}
		for _, m := range f.GetMetric() {
			if !sel.match(m) {
				continue
			}
			var blocks, size int64
			for _, lp := range m.GetLabel() {
				v, err := strconv.ParseInt(lp.GetValue(), 10, 64)
				if err != nil || v <= 0 || v > maxKVTokens {
					continue
				}
				switch lp.GetName() {
				case ci.blocks:
					blocks = v
				case ci.blockSize:
					size = v
				}
			}
			if blocks > 0 && size > 0 && blocks <= maxKVTokens/size {
				best = max(best, blocks*size)
			}
		}
		return best
	}
	return 0
}

// MaxReportedCacheBlocks caps the capacity a replica takes from its
// engine's report (cache_blocks unset): 262,144 blocks, 4,194,304 tokens
// at 16 a block, so that the KV-event map of an engine (KVMapFactor ×
// capacity) stays within kvevents.DefaultMaxMapped, whatever the engine
// claims. A larger engine's capacity is set with cache_blocks.
const MaxReportedCacheBlocks = kvevents.DefaultMaxMapped / KVMapFactor

// cacheBlocksFor converts an engine's KV-cache size in tokens into blocks
// of a model's index: tokens of blockTokens each on the exact index, else
// (approximate index, keyed by prompt bytes) blockBytes bytes of about
// bytesPerToken bytes a token. The result is clamped to
// 1..MaxReportedCacheBlocks; 0 when tokens is 0 (unknown).
func cacheBlocksFor(tokens int64, exact bool, blockTokens, blockBytes int) int {
	if tokens <= 0 {
		return 0
	}
	var blocks float64
	if exact {
		blocks = float64(tokens) / float64(max(blockTokens, 1))
	} else {
		blocks = float64(tokens) * bytesPerToken / float64(max(blockBytes, 1))
	}
	return int(min(max(math.Floor(blocks), 1), MaxReportedCacheBlocks))
}

// learnCapacity scrapes a newly configured engine once, at once rather
// than at the next scrape, for its KV-cache size, and applies the running
// configuration again when it reports one (see Endpoint.kvTokens): the
// replica is replaced in place with that capacity, which drops its index,
// so better before the first requests than a scrape interval into them.
// Apply calls it while Run runs, with Run's context; the scrape is also
// bounded by ProbeTimeout (the control client's timeout).
func (s *Fleet) learnCapacity(ctx context.Context, ep *Endpoint) {
	res, err := scrape(ctx, s.control, ep.Base, s.engineTypeOf(s.state.Load(), ep), s.custom, s.scrapeBudget)
	if err != nil || res.kvTokens <= 0 || ep.kvTokens.Swap(res.kvTokens) == res.kvTokens {
		return
	}
	s.log.Info("gateway: engine KV-cache size", "engine", ep.Base, "tokens", res.kvTokens)
	if err := s.reapply(); err != nil {
		s.log.Warn("gateway: applying an engine's KV-cache size failed", "engine", ep.Base, "err", err)
	}
}
