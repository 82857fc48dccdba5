package kvevents

import (
	"container/list"
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// CachedTokenizer remembers the tokens of the requests it has tokenized.
//
// What is safe to cache: a request's tokens depend on its model, its
// prompt or messages, tools and template arguments, and the engine's
// tokenizer and chat template. The key covers all of the request's part
// (hashed to 128 bits, so the cache holds no prompt text); the engine's
// part changes only when the model is redeployed, which TTL bounds. Only
// whole requests are cached: a prefix's tokens are not in general a
// prefix of the whole prompt's tokens (merges across the boundary, the
// chat template's closing), so no partial result is reused. Failures are
// not cached. Concurrent requests for the same key share one call.
//
// It pays where prompts repeat whole: retries, several gateways asking
// for the same request, workloads of identical prompts.
type CachedTokenizer struct {
	inner     Tokenizer
	maxTokens int
	ttl       time.Duration
	now       func() time.Time

	mu       sync.Mutex
	lru      *list.List // of *cacheEntry, most recent first
	m        map[cacheKey]*list.Element
	tokens   int // held
	cost     int // tokens held plus entryCost an entry, bounded by maxTokens
	inflight map[cacheKey]*tokenCall
	st       CacheStats
}

var _ Tokenizer = (*CachedTokenizer)(nil)

// CacheOptions configure a CachedTokenizer; zero fields take defaults.
type CacheOptions struct {
	// MaxTokens bounds the tokens held, 4 bytes each, each entry
	// counted with entryCost more for its own memory (its key, list
	// element and map slot), so that the cache's memory stays near
	// 4 × MaxTokens bytes however short the answers. Default 1<<22
	// (16 MiB). A request whose tokens and entryCost pass MaxTokens/16
	// is not cached.
	MaxTokens int
	// TTL is how long an entry is trusted. Default 10 minutes.
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// CacheStats count a CachedTokenizer's lookups.
type CacheStats struct {
	Hits, Misses, Shared uint64 // Shared: waited for a concurrent call
	Entries, Tokens      int
}

type cacheKey struct{ a, b uint64 }

// entryCost is what an entry costs beside its tokens, in tokens (4 bytes
// each): TestMeasureTokenCache measured 182 bytes an entry of no token in
// a cache at its bound (its key, list element and map slot, the map at
// its load factor).
const entryCost = 48

type cacheEntry struct {
	key     cacheKey
	tokens  []uint32
	expires time.Time
}

type tokenCall struct {
	done   chan struct{}
	tokens []uint32
	err    error
	// gone: the call failed with its caller's context ended, a failure
	// of that caller alone, which its waiters do not share (they ask
	// again).
	gone bool
}

// NewCachedTokenizer caches inner's results.
func NewCachedTokenizer(inner Tokenizer, o CacheOptions) *CachedTokenizer {
	if o.MaxTokens <= 0 {
		o.MaxTokens = 1 << 22
	}
	if o.TTL <= 0 {
		o.TTL = 10 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &CachedTokenizer{inner: inner, maxTokens: o.MaxTokens, ttl: o.TTL, now: o.Now,
		lru: list.New(), m: map[cacheKey]*list.Element{}, inflight: map[cacheKey]*tokenCall{}}
}

func keyOf(r TokenizeRequest) cacheKey {
	var a, b xxhash.Digest
	a.ResetWithSeed(0x9e3779b97f4a7c15)
	b.ResetWithSeed(0xc2b2ae3d27d4eb4f)
	var n [8]byte
	for _, f := range [...][]byte{[]byte(r.Model), []byte(r.Prompt), r.Messages, r.Tools, r.ChatTemplateKwargs} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(f)))
		_, _ = a.Write(n[:])
		_, _ = a.Write(f)
		_, _ = b.Write(n[:])
		_, _ = b.Write(f)
	}
	return cacheKey{a.Sum64(), b.Sum64()}
}

// Tokenize implements Tokenizer. The returned slice is shared with the
// cache: callers must not modify it (appending is fine). A call shared
// with a caller that goes away (its context ends) is asked again by the
// others.
func (c *CachedTokenizer) Tokenize(ctx context.Context, req TokenizeRequest) ([]uint32, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	k := keyOf(req)
	for {
		tokens, again, err := c.tokenize(ctx, req, k)
		if !again {
			return tokens, err
		}
	}
}

// tokenize is one attempt of Tokenize; again reports that the call it
// waited for failed for its caller alone (tokenCall.gone).
func (c *CachedTokenizer) tokenize(ctx context.Context, req TokenizeRequest, k cacheKey) (tokens []uint32, again bool, err error) {
	now := c.now()
	c.mu.Lock()
	if el, ok := c.m[k]; ok {
		e := el.Value.(*cacheEntry)
		if now.Before(e.expires) {
			c.lru.MoveToFront(el)
			c.st.Hits++
			c.mu.Unlock()
			return e.tokens, false, nil
		}
		c.drop(el)
	}
	if call, ok := c.inflight[k]; ok {
		c.st.Shared++
		c.mu.Unlock()
		select {
		case <-call.done:
			if call.gone && ctx.Err() == nil {
				return nil, true, nil
			}
			return call.tokens, false, call.err
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	c.st.Misses++
	call := &tokenCall{done: make(chan struct{})}
	c.inflight[k] = call
	c.mu.Unlock()

	tokens, err = c.inner.Tokenize(ctx, req)
	if cap(tokens) > len(tokens)+len(tokens)/8 {
		// An answer read into a grown buffer: the entry keeps only
		// what it counts.
		tokens = slices.Clone(tokens)
	}
	tokens = tokens[:len(tokens):len(tokens)]
	call.tokens, call.err, call.gone = tokens, err, err != nil && ctx.Err() != nil
	c.mu.Lock()
	delete(c.inflight, k)
	if err == nil && len(tokens)+entryCost <= c.maxTokens/16 {
		c.m[k] = c.lru.PushFront(&cacheEntry{key: k, tokens: tokens, expires: now.Add(c.ttl)})
		c.tokens += len(tokens)
		c.cost += len(tokens) + entryCost
		for c.cost > c.maxTokens {
			c.drop(c.lru.Back())
		}
	}
	c.mu.Unlock()
	close(call.done)
	return tokens, false, err
}

func (c *CachedTokenizer) drop(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.m, e.key)
	c.tokens -= len(e.tokens)
	c.cost -= len(e.tokens) + entryCost
}

// Stats returns the cache's counters.
func (c *CachedTokenizer) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Entries, s.Tokens = c.lru.Len(), c.tokens
	return s
}
