package hashtab

// Seed is the secret of a table's placement: Mix(h) = K2·f(K1·(h ⊕ K0))
// with f(x) = x ⊕ (x >> 32). K1 and K2 are odd, so every step, and Mix,
// is a permutation of the 64-bit values: distinct keys stay distinct, so a
// table keyed by Mix(h) is exact whatever the secret, which decides only
// where a key sits. The tables use the top bits of the result, which
// depend on every bit of h.
type Seed struct{ K0, K1, K2 uint64 }

// NewSeed expands a secret into a Seed with splitmix64.
func NewSeed(secret uint64) Seed {
	next := func() uint64 {
		secret += 0x9e3779b97f4a7c15
		z := secret
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		return z ^ z>>31
	}
	return Seed{next(), next() | 1, next() | 1}
}

// Mix returns the placed hash of h.
func (s Seed) Mix(h uint64) uint64 {
	h ^= s.K0
	h *= s.K1
	h ^= h >> 32
	return h * s.K2
}

// Unmix inverts Mix: Unmix(Mix(h)) == h.
func (s Seed) Unmix(m uint64) uint64 {
	u := s.unmixer()
	return u.unmix(m)
}

// unmixer is Unmix with the inverses of K1 and K2 computed once.
type unmixer struct{ k0, i1, i2 uint64 }

func (s Seed) unmixer() unmixer { return unmixer{s.K0, oddInverse(s.K1), oddInverse(s.K2)} }

func (u *unmixer) unmix(m uint64) uint64 {
	m *= u.i2
	m ^= m >> 32
	m *= u.i1
	return m ^ u.k0
}

// oddInverse returns the inverse of odd k modulo 2^64 (Newton's iteration
// doubles the correct low bits from 3).
func oddInverse(k uint64) uint64 {
	x := k
	for range 5 {
		x *= 2 - k*x
	}
	return x
}

// Mix64 hashes two words with SplitMix64's finaliser: the gateway's random
// tie-breaks and the simulator's seeded draws.
func Mix64(a, b uint64) uint64 {
	z := a + 0x9e3779b97f4a7c15*(b+1)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
