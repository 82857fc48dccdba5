package sim

import (
	"io"
	"math/rand/v2"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/hashtab"
	"github.com/examlops/gateway/keys"
)

// Bound is a hit-rate bound computed on the same requests as the policies.
type Bound struct {
	// Name is "pooled-lru" or "unbounded".
	Name string `json:"name"`
	// CacheBlocks is the capacity of the one cache, 0 for unbounded.
	CacheBlocks int `json:"cache_blocks"`
	// TokenHitRate is the fraction of prompt tokens served from cache.
	TokenHitRate float64 `json:"token_hit_rate"`
	// RequestHitRate is the fraction of requests with any cached block.
	RequestHitRate float64 `json:"request_hit_rate"`
}

// bounds computes, in arrival order and without timing, the hit rates of
// one LRU cache of capacity blocks (the whole cluster's cache pooled) and
// of one unbounded cache, and into ideal the time to first token each
// request would see alone on an idle replica of preset p holding the
// pooled cache (Preset.LoneTTFT), at speed, the fastest replica's
// (Config.ReplicaSpeeds). A request's cached tokens are counted as
// in the simulation: its leading cached blocks, at most all tokens but
// one. Answers (Request.OutBlocks) are cached after their prompt.
// Requests too large for one replica (of repCap blocks), which fail in the
// simulation, are left out of ideal.
func bounds(st Stream, bt, capacity, repCap int, p Preset, speed float64, ideal *hist, tick func()) (pooled, unb Bound, err error) {
	// Tables placed by per-run secrets: a crafted trace cannot aim
	// collisions at them, and they are exact whatever the secrets.
	lru := newKVCache(capacity, rand.Uint64())
	seen := hashtab.New[struct{}](1024, rand.Uint64())
	var req Request
	var key gateway.Key
	var slots []int32
	var in, lruTok, unbTok int64
	var n, lruReq, unbReq int
	for {
		if err = st.Next(&req); err == io.EOF {
			break
		} else if err != nil {
			return pooled, unb, err
		}
		tick()
		if req.InputTokens < 1 || len(req.Blocks) == 0 {
			continue
		}
		n++
		key = keys.Salt(keys.AppendHashes(keys.AppendHashes(key[:0], req.Blocks), req.OutBlocks), req.Adapter)
		prompt := key[:len(req.Blocks)]
		in += int64(req.InputTokens)
		if cap(slots) < len(prompt) {
			slots = make([]int32, 2*len(prompt))
		}
		m := lru.match(prompt, slots)
		cached := min(m*bt, req.InputTokens-1)
		if m > 0 {
			lruReq++
			lruTok += int64(cached)
		}
		private := max(0, blocksOf(req.InputTokens+max(1, req.OutputTokens), bt)-len(prompt), len(req.OutBlocks))
		if ideal != nil && len(prompt)+private <= repCap {
			ideal.add(p.loneTTFTAt(cached, req.InputTokens-cached, speed).Seconds())
		}
		// The unbounded cache: the leading blocks of the prompt seen
		// before, found while adding every block of key (a block of the
		// leading run repeated later in it was seen before too).
		u := 0
		for i, h := range key {
			if had, _ := seen.Put(h, struct{}{}); had && i == u && i < len(prompt) {
				u++
			}
		}
		if u > 0 {
			unbReq++
			unbTok += int64(min(u*bt, req.InputTokens-1))
		}
		if len(key) > len(prompt) {
			lru.touch(key[len(prompt):], nil, 0)
		}
		lru.touch(prompt, slots, m)
		lru.evicted = lru.evicted[:0]
	}
	pooled = Bound{Name: "pooled-lru", CacheBlocks: capacity}
	unb = Bound{Name: "unbounded"}
	if in > 0 {
		pooled.TokenHitRate = float64(lruTok) / float64(in)
		unb.TokenHitRate = float64(unbTok) / float64(in)
	}
	if n > 0 {
		pooled.RequestHitRate = float64(lruReq) / float64(n)
		unb.RequestHitRate = float64(unbReq) / float64(n)
	}
	return pooled, unb, nil
}
