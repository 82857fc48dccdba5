package flow

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/net/http/httpguts"
)

// Rate limits one client's requests to PerSecond on average and Burst at
// once. Admit is its decision, the generic cell rate algorithm (GCRA): a
// client's whole state is one time, its theoretical arrival time, and a
// request is admitted when that time is at most Burst-1 intervals
// (1/PerSecond) ahead of now. The zero value limits nothing.
type Rate struct {
	// PerSecond is the long-run rate admitted; 0 is no limit.
	PerSecond float64 `json:"per_second"`
	// Burst is how many requests a client that has been idle may send at
	// once; at least 1 when PerSecond is set.
	Burst int `json:"burst"`
}

// Validate reports a Rate that cannot be used, naming the field and the
// value.
func (r Rate) Validate() error {
	switch {
	case r.PerSecond < 0 || math.IsNaN(r.PerSecond) || math.IsInf(r.PerSecond, 0):
		return fmt.Errorf("%w: Rate.PerSecond %v: want a finite rate ≥ 0", ErrInvalid, r.PerSecond)
	case r.PerSecond > 0 && r.Burst < 1:
		return fmt.Errorf("%w: Rate.Burst %d: want at least 1", ErrInvalid, r.Burst)
	case r.PerSecond > 0 && r.PerSecond < 1e-6:
		return fmt.Errorf("%w: Rate.PerSecond %v: want at least 1e-6 (one request in 11.6 days)", ErrInvalid, r.PerSecond)
	}
	return nil
}

// interval is the time between two requests at PerSecond, in
// nanoseconds, at least 1: rounded up, since rounded down it admits more
// than PerSecond (TestRateWindowBound).
func (r Rate) interval() int64 { return max(1, int64(math.Ceil(1e9/r.PerSecond))) }

// Admit decides a request at now (nanoseconds on any clock that does not
// go back) of a client whose theoretical arrival time is tat (0, or any
// time not after now, for a client with its burst whole). Admitted, it
// returns the client's next tat and a wait of 0; refused, it returns tat
// as it was and how long until a request would be admitted. It is a pure
// function: the caller keeps tat.
//
// Over any window of length L, a client is admitted at most
// Burst + L·PerSecond requests; a client that sends no faster than
// PerSecond is always admitted; a request refused with a wait w is
// admitted at now+w if none is admitted between (TestPropRate).
func (r Rate) Admit(tat, now int64) (next int64, wait time.Duration) {
	if r.PerSecond <= 0 {
		return tat, 0
	}
	t := r.interval()
	tat = max(tat, now)
	// The tolerance, Burst-1 intervals, saturating: a huge burst is no
	// limit on bursts, not an overflow.
	tau := int64(math.MaxInt64 / 4)
	if b := int64(r.Burst - 1); b < tau/t {
		tau = b * t
	}
	if ahead := tat - now; ahead > tau {
		return tat, time.Duration(ahead - tau)
	}
	if tat > math.MaxInt64-t { // saturating: a wrapped tat would admit all
		return math.MaxInt64, 0
	}
	return tat + t, 0
}

// DefaultRateClients is RateLimiter's default bound on the clients it
// keeps: 65,536, 2.2 MiB of heap (TestMeasureRateLimiterMemory).
const DefaultRateClients = 65536

// RateLimit configures a RateLimiter: the Rate each client gets, what
// tells clients apart, and how many are kept.
type RateLimit struct {
	Rate
	// Key tells clients apart: "" or "ip", the client's IP address (its
	// connection's peer: behind a proxy every client has the proxy's; an
	// IPv6 address by its /64 network); or
	// "header:NAME", the value of that request header (an API key, a
	// tenant, GIE's fairness id), and the IP address for a request
	// without it. Values are kept as 64-bit hashes, never as text.
	Key string
	// MaxClients bounds the clients kept; 0 means DefaultRateClients.
	// Past it a new client takes the place of one whose burst is whole
	// again (nothing is lost), else of the one nearest to that among a
	// few sampled, which may let that client send its burst again early
	// (counted in RateLimiterStats.Forgotten).
	MaxClients int
}

// Validate reports a RateLimit that cannot be used, naming the field and
// the value.
func (o RateLimit) Validate() error {
	if err := o.Rate.Validate(); err != nil {
		return err
	}
	if _, err := o.header(); err != nil {
		return err
	}
	if o.MaxClients < 0 {
		return fmt.Errorf("%w: RateLimit.MaxClients %d is negative", ErrInvalid, o.MaxClients)
	}
	return nil
}

// header returns the header of Key, "" for the IP address.
func (o RateLimit) header() (string, error) {
	switch {
	case o.Key == "" || o.Key == "ip":
		return "", nil
	case strings.HasPrefix(o.Key, "header:") && httpguts.ValidHeaderFieldName(o.Key[len("header:"):]):
		return o.Key[len("header:"):], nil
	}
	return "", fmt.Errorf("%w: RateLimit.Key %q: want ip or header:NAME", ErrInvalid, o.Key)
}

// RateLimiter keeps each client's GCRA state and decides its requests
// (Rate.Admit). Safe for concurrent use; its memory is bounded by
// MaxClients. A nil *RateLimiter admits everything.
type RateLimiter struct {
	o      RateLimit
	header string
	max    int
	epoch  time.Time

	mu      sync.Mutex
	tats    map[uint64]int64 // client hash → theoretical arrival time (ns since epoch)
	limited atomic.Uint64
	forgot  atomic.Uint64
}

// NewRateLimiter returns the limiter o describes, or nil (no limit) when
// o.PerSecond is 0.
func NewRateLimiter(o RateLimit) (*RateLimiter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.PerSecond == 0 {
		return nil, nil
	}
	h, _ := o.header()
	n := o.MaxClients
	if n == 0 {
		n = DefaultRateClients
	}
	return &RateLimiter{o: o, header: h, max: n, epoch: time.Now(), tats: map[uint64]int64{}}, nil
}

// Limit returns the limiter's configuration.
func (l *RateLimiter) Limit() RateLimit { return l.o }

// Header is a request's headers: http.Header, or the picker's.
type Header interface{ Get(name string) string }

// Client is the key of the client of a request with headers h from the
// address remote (host:port, or an IP address): a hash of the header Key
// names when the request has it, else of the IP address (of remote as it
// is when it does not parse).
func (l *RateLimiter) Client(h Header, remote string) uint64 {
	if l.header != "" {
		if v := h.Get(l.header); v != "" {
			return xxhash.Sum64String(v) ^ 0x9e3779b97f4a7c15 // apart from addresses
		}
	}
	// Only the parse the shape calls for, since a failed one allocates
	// its error: host:port has one colon or a bracket, a bare address
	// none or several, so the other parse could not accept it either.
	if strings.HasPrefix(remote, "[") || strings.Count(remote, ":") == 1 {
		if ap, err := netip.ParseAddrPort(remote); err == nil {
			return addrClient(ap.Addr())
		}
	} else if a, err := netip.ParseAddr(remote); err == nil {
		return addrClient(a)
	}
	return xxhash.Sum64String(remote)
}

// addrClient is the client key of an address: an IPv4 address (mapped
// or not) as it is, an IPv6 address by its /64 network, which one host
// is commonly given whole (a client changing the low 64 bits is one
// client).
func addrClient(a netip.Addr) uint64 {
	a = a.Unmap()
	b := a.As16()
	if a.Is6() {
		clear(b[8:])
	}
	return xxhash.Sum64(b[:])
}

// Allow decides a request of client at now: admitted, or refused with how
// long until one would be.
func (l *RateLimiter) Allow(client uint64, now time.Time) (ok bool, wait time.Duration) {
	if l == nil {
		return true, 0
	}
	t := now.Sub(l.epoch).Nanoseconds()
	l.mu.Lock()
	tat, known := l.tats[client]
	if !known {
		tat = t // its burst whole
	}
	next, wait := l.o.Admit(tat, t)
	if wait == 0 {
		if !known && len(l.tats) >= l.max {
			l.evict(t)
		}
		l.tats[client] = next
	}
	l.mu.Unlock()
	if wait > 0 {
		l.limited.Add(1)
		return false, wait
	}
	return true, 0
}

// evictSample is how many clients evict looks at for one to drop.
const evictSample = 16

// evict drops one client, under mu: the first of a few (the map's own
// random order) whose burst is whole again at t, else the one nearest to
// that.
func (l *RateLimiter) evict(t int64) {
	var victim uint64
	best, seen := int64(math.MaxInt64), 0
	for k, tat := range l.tats {
		if tat <= t {
			delete(l.tats, k)
			return
		}
		if tat < best {
			victim, best = k, tat
		}
		if seen++; seen == evictSample {
			break
		}
	}
	delete(l.tats, victim)
	l.forgot.Add(1)
}

// RateLimiterStats counts a RateLimiter's decisions.
type RateLimiterStats struct {
	// Clients is the number of clients kept; Limited counts the requests
	// refused; Forgotten the clients dropped to make room while their
	// burst was not whole.
	Clients            int
	Limited, Forgotten uint64
}

// Stats returns the limiter's counts.
func (l *RateLimiter) Stats() RateLimiterStats {
	l.mu.Lock()
	n := len(l.tats)
	l.mu.Unlock()
	return RateLimiterStats{Clients: n, Limited: l.limited.Load(), Forgotten: l.forgot.Load()}
}
