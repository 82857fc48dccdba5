package gateway

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"
)

// defaultCacheBlocks is the prefix-cache capacity, in blocks, of a Replica
// whose CacheBlocks is zero.
const defaultCacheBlocks = 16384

// Replica describes one model-server replica. The zero value is not valid:
// Name is required.
type Replica struct {
	// Name identifies the replica; unique within a Gateway.
	Name string
	// Address is where the replica serves, for callers that proxy to it
	// (for example "http://10.0.0.7:8000"). Optional; the router ignores it.
	Address string
	// CacheBlocks is how many prefix blocks the router's index remembers
	// for this replica, evicting least recently used blocks beyond it; at
	// most MaxCacheBlocks. Zero means 16,384 blocks: 262,144 tokens at 16
	// tokens a block, about 32 GiB of KV cache for Llama 3.1 8B at 128 KiB
	// a token.
	CacheBlocks int
	// Unhealthy starts the replica out of rotation. The zero value is
	// healthy.
	Unhealthy bool
}

// Load holds the load signals a model server reports, usually scraped from
// its metrics endpoint. The zero value is an idle replica.
type Load struct {
	// QueueDepth is the number of requests waiting to be scheduled
	// (vLLM's num_requests_waiting), at most 2³¹−1.
	QueueDepth int
	// Running is the number of requests in the running batch
	// (vLLM's num_requests_running), at most 2³¹−1.
	Running int
	// KVUtilization is the fraction of KV-cache memory in use, 0..1
	// (vLLM's kv_cache_usage_perc).
	KVUtilization float64
	// Latency, when positive, replaces the replica's smoothed latency, the
	// signal compared with the SLO. Zero leaves it as it was.
	Latency time.Duration
	// PeerPrefill is the prefill, in uncached blocks, that the other
	// gateways routing to this replica report pending there (their own
	// Candidate.PendingPrefill, summed): CacheAware prices the replica's
	// queue as PendingPrefill plus PeerPrefill. Zero, the default, means
	// no peers (or none reporting): routing as with one gateway. At most
	// 2³¹−1. See docs/multi-gateway.md.
	PeerPrefill int
	// At is when the load was observed, the age Admission.Staleness
	// weighs: a front that passes a load on again (its peers' counts
	// arriving between two scrapes of the engine) keeps the scrape's time.
	// Zero, the default, means now, by the gateway's clock (WithClock),
	// which must be the clock At was read from; a time after now counts
	// as now. Replicas reports it as zero.
	At time.Time
}

// maxRequestCount is the largest QueueDepth or Running that UpdateLoad
// accepts: a larger count is a broken report, and summing two of them must
// not overflow.
const maxRequestCount = 1<<31 - 1

func (l Load) validate(name string) error {
	switch {
	case l.QueueDepth < 0 || l.QueueDepth > maxRequestCount:
		return fmt.Errorf("%w: replica %q: QueueDepth %d is outside 0..%d", ErrInvalid, name, l.QueueDepth, maxRequestCount)
	case l.Running < 0 || l.Running > maxRequestCount:
		return fmt.Errorf("%w: replica %q: Running %d is outside 0..%d", ErrInvalid, name, l.Running, maxRequestCount)
	case math.IsNaN(l.KVUtilization) || l.KVUtilization < 0 || l.KVUtilization > 1:
		return fmt.Errorf("%w: replica %q: KVUtilization %v is outside 0..1", ErrInvalid, name, l.KVUtilization)
	case l.PeerPrefill < 0 || l.PeerPrefill > maxRequestCount:
		return fmt.Errorf("%w: replica %q: PeerPrefill %d is outside 0..%d", ErrInvalid, name, l.PeerPrefill, maxRequestCount)
	case l.Latency < 0:
		return fmt.Errorf("%w: replica %q: Latency %v is negative", ErrInvalid, name, l.Latency)
	case !l.At.IsZero() && (l.At.Before(minLoadAt) || l.At.After(maxLoadAt)):
		return fmt.Errorf("%w: replica %q: At %v is outside %v..%v", ErrInvalid, name, l.At, minLoadAt, maxLoadAt)
	}
	return nil
}

// The times Load.At may take: those whose Unix nanoseconds fit an int64
// (1677 to 2262); one before would wrap to a time far ahead, which counts
// as now.
var minLoadAt, maxLoadAt = time.Unix(0, math.MinInt64).UTC(), time.Unix(0, math.MaxInt64).UTC()

// ReplicaStatus is a point-in-time view of one replica, as Gateway.Replicas
// returns it.
type ReplicaStatus struct {
	// Name and Address are the replica's, as added.
	Name    string
	Address string
	// Healthy is false while the replica is marked unhealthy.
	Healthy bool
	// Load is the last reported load, with Latency the smoothed latency.
	Load Load
	// InFlight counts requests routed here whose Done has not been called.
	InFlight int
	// PendingPrefill counts uncached prefix blocks routed here whose first
	// token has not been reported.
	PendingPrefill int
	// AssignedPrefill counts the uncached blocks routed here since the
	// replica was added: the prefill work the gateway has sent it.
	AssignedPrefill int
	// Routed counts every request routed here; Hits those whose whole
	// prefix was cached here.
	Routed, Hits uint64
	// CachedBlocks is how many blocks the index records for this replica;
	// CacheBlocks its capacity.
	CachedBlocks, CacheBlocks int
	// Adapters is the engine's last LoRA adapter report (UpdateAdapters),
	// lists sorted; the zero value before any.
	Adapters AdapterReport
	// BlockTime and TokenTime are the replica's learned speed, as routing
	// sees it (Candidate.BlockTime, Candidate.TokenTime); 0 while unknown.
	BlockTime, TokenTime time.Duration
}

// latencyAlpha is the weight of a new latency sample in the smoothed
// latency (an exponentially weighted moving average).
const latencyAlpha = 0.3

// replicaState is a replica's live state. Its identity fields never change;
// its signals are atomics, so load updates never contend with routing.
type replicaState struct {
	// What every Route reads of every replica comes first, in 64 bytes:
	// the struct is 256 bytes, a size class whose objects are 256-byte
	// aligned, so these share one cache line (TestReplicaStateLayout).
	slot     uint32
	healthy  atomic.Bool
	queue    atomic.Int32 // Load.QueueDepth, at most maxRequestCount
	running  atomic.Int32 // Load.Running, likewise
	peer     atomic.Int32 // Load.PeerPrefill, likewise
	_        int32
	kv       atomic.Uint64 // float64 bits
	latency  atomic.Int64  // smoothed, nanoseconds
	inflight atomic.Int64
	pending  atomic.Int64
	assigned atomic.Int64 // uncached blocks routed here, cumulative

	latencyAt   atomic.Int64 // clock of the last latency sample, Unix nanoseconds
	loadAt      atomic.Int64 // clock of the last UpdateLoad, Unix nanoseconds; 0 never
	routed      atomic.Uint64
	hits        atomic.Uint64
	name, addr  string
	cacheBlocks int
	clock       func() time.Time

	lora loraState // LoRA adapters (lora.go)

	speed   atomic.Uint64 // Candidate.BlockTime and TokenTime packed (speedFit.packed), published by learner
	learner *speedLearner // the fit behind speed
	_       [replicaStatePad]byte
}

// replicaStatePad pads replicaState to 256 bytes.
const replicaStatePad = 256 - 160 - unsafe.Sizeof(loraState{})

func (rs *replicaState) load() Load {
	return Load{
		QueueDepth:    int(rs.queue.Load()),
		Running:       int(rs.running.Load()),
		KVUtilization: math.Float64frombits(rs.kv.Load()),
		Latency:       time.Duration(rs.latency.Load()),
		PeerPrefill:   int(rs.peer.Load()),
	}
}

// loadInto writes the replica's load into l field by field: Route's loop
// calls it, as assigning load()'s result built the struct on the stack
// and copied it with 16-byte loads that straddle the 8-byte stores, a
// store-forwarding stall per replica.
func (rs *replicaState) loadInto(l *Load) {
	l.QueueDepth = int(rs.queue.Load())
	l.Running = int(rs.running.Load())
	l.KVUtilization = math.Float64frombits(rs.kv.Load())
	l.Latency = time.Duration(rs.latency.Load())
	l.PeerPrefill = int(rs.peer.Load())
}

// outstanding is the replica's Candidate.Outstanding.
func (rs *replicaState) outstanding() int {
	c := Candidate{InFlight: int(rs.inflight.Load()), Load: Load{QueueDepth: int(rs.queue.Load()), Running: int(rs.running.Load())}}
	return c.Outstanding()
}

// observeLatency folds a latency sample into the smoothed latency. With a
// ttl (the gateway's latency TTL when it has an SLO, else 0), a smoothed
// latency whose last sample is that old no longer counts, and the sample
// replaces it: the replica is measured afresh (withLatencyTTL).
func (rs *replicaState) observeLatency(d time.Duration, now time.Time, ttl time.Duration) {
	expired := ttl > 0 && now.UnixNano()-rs.latencyAt.Load() >= int64(ttl)
	for {
		old := rs.latency.Load()
		nv := int64(d)
		if old > 0 && !expired {
			nv = old + int64(latencyAlpha*float64(int64(d)-old))
		}
		if rs.latency.CompareAndSwap(old, nv) {
			break
		}
	}
	rs.latencyAt.Store(now.UnixNano())
}

// addClamped adds d to v without letting it fall below zero, so a stray
// report cannot make load negative.
func addClamped(v *atomic.Int64, d int64) {
	for {
		old := v.Load()
		nv := max(old+d, 0)
		if v.CompareAndSwap(old, nv) {
			return
		}
	}
}
