package sim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"
)

// Request is one request of a workload.
type Request struct {
	// Arrival is when the request reaches the gateway, from the start of
	// the run.
	Arrival time.Duration
	// InputTokens is the prompt length in tokens.
	InputTokens int
	// OutputTokens is the completion length in tokens; the simulation
	// produces at least one.
	OutputTokens int
	// Blocks has one id per block of the prompt (ceil(InputTokens /
	// BlockTokens) of them). Two prompts share KV cache for exactly as many
	// leading blocks as their lists agree on (ids are chained again before
	// use, so small integers work, as in Mooncake traces).
	Blocks []uint64
	// OutBlocks, optional, continues Blocks with the ids of the full blocks
	// of the answer; they are cached when the request completes, so a later
	// prompt that extends this one (the next turn of a chat) can reuse them.
	OutBlocks []uint64
	// UserBlock is the index in Blocks of the block where the first user
	// message begins, after the system prompt, for routers that key on it
	// (KubeAI's CHWBL hashes its first characters); 0 when the prompt has
	// no system part. Traces do not say: their decoder infers it from where
	// the prompts read so far first branch (after a shared system prompt).
	UserBlock int
	// Adapter is the LoRA adapter the request names; "" is the base model.
	// Its blocks are the adapter's own (the engine salts them, as vLLM's
	// block hashes include the adapter), and a replica runs at most
	// Config.MaxLoras adapters at once (see lora.go).
	Adapter string
	// Tenant is the request's fairness id (a tenant, a user tier, an API
	// key): flow control shares a band fairly among tenants, and the
	// report has a per-tenant table when requests name one. "" is none.
	Tenant string
	// Class names the request's class; "" is none. The report has a
	// per-class table when requests name one.
	Class string
	// Priority is the request's band under flow control: higher
	// dispatches first; negative is shed rather than held. Default 0.
	Priority int
	// SLO is the request's time-to-first-token objective; 0 means
	// Config.SLO.
	SLO time.Duration
	// TPOTSLO is the request's time-per-output-token objective, (last
	// token − first token) / (OutputTokens − 1); 0, the default, is none.
	// The report gives its attainment per class and tenant (Objectives).
	TPOTSLO time.Duration
}

// Workload is a reproducible source of requests.
type Workload interface {
	// Name describes the workload in one line.
	Name() string
	// BlockTokens is the number of tokens per block of Request.Blocks.
	BlockTokens() int
	// Open starts a fresh stream of the workload's requests; the same seed
	// gives the same requests.
	Open(seed uint64) (Stream, error)
}

// Stream yields a workload's requests in order of arrival.
type Stream interface {
	// Next fills r with the next request and returns nil, or returns
	// io.EOF at the end. r's slices may be reused by the next call.
	Next(r *Request) error
	// Len returns the number of requests the stream yields in all, or -1
	// if it does not know.
	Len() int
	// Close releases the stream's resources.
	Close() error
}

// Arrivals, shared by the generated workloads: Poisson at rate per second.
// name labels the workload in err, set once an arrival leaves
// time.Duration's range (a tiny rate); the stream must then fail with err.
type poisson struct {
	rng  *rand.Rand
	rate float64
	t    float64
	name string
	err  error
}

func (p *poisson) next() time.Duration {
	if p.rate > 0 {
		p.t += p.rng.ExpFloat64() / p.rate
	}
	ns := p.t * 1e9
	if ns >= maxDurationF {
		if p.err == nil {
			p.err = fmt.Errorf("%w: %s: Rate %v puts an arrival at %.4g s, beyond time.Duration's range (about 2.9e8 s)",
				ErrInvalidConfig, p.name, p.rate, p.t)
		}
		return math.MaxInt64
	}
	return time.Duration(ns)
}

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

func blocksOf(tokens, bt int) int { return (tokens + bt - 1) / bt }

// mix is a 64-bit finaliser (splitmix64) used to derive block ids.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// appendIDs appends n block ids derived from (space, item) to dst.
func appendIDs(dst []uint64, space, item uint64, n int) []uint64 {
	base := content(space, item)
	for i := range n {
		dst = append(dst, mix(base+uint64(i)))
	}
	return dst
}

func checkGen(name string, requests int, rate float64, fields ...any) error {
	if requests < 0 {
		return fmt.Errorf("%w: %s: Requests %d is negative", ErrInvalidConfig, name, requests)
	}
	if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return fmt.Errorf("%w: %s: Rate %v must be a finite value >= 0", ErrInvalidConfig, name, rate)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		if v, ok := fields[i+1].(int); ok && v < 0 {
			return fmt.Errorf("%w: %s: %s %d is negative", ErrInvalidConfig, name, fields[i], v)
		}
	}
	return nil
}

// orDefault returns v, or d when v is the zero value: a Config field left
// at zero takes its documented default.
func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// genStream is a Stream of n generated requests arriving Poisson at rate
// per second. Each request's arrival is drawn from rng before gen fills in
// the rest; gen is given the request's number, counting from 1.
type genStream struct {
	n, i int
	arr  poisson
	gen  func(r *Request, q uint64)
}

// newGenStream returns a genStream over rng labelled name in errors.
func newGenStream(name string, n int, rate float64, rng *rand.Rand, gen func(r *Request, q uint64)) *genStream {
	return &genStream{n: n, arr: poisson{rng: rng, rate: rate, name: name}, gen: gen}
}

func (s *genStream) Next(r *Request) error {
	if s.i >= s.n {
		return io.EOF
	}
	s.i++
	r.Arrival = s.arr.next()
	s.gen(r, uint64(s.i))
	return s.arr.err
}
func (s *genStream) Len() int     { return s.n }
func (s *genStream) Close() error { return nil }
