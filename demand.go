package gateway

// Prefix demand, for replicating hot prefixes.
//
// A prefix that a large share of traffic shares (one long system prompt)
// should be held by about that share of the replicas, so that its traffic
// can spread (Preble, Srivatsa et al. 2024). The cache-aware cost alone is
// myopic: it charges every request that would warm another replica the
// whole prefill of the prefix, never amortised over the requests that
// would hit there afterwards, so a hot prefix stays on the few replicas
// that got it first.
//
// The gateway therefore counts, per prefix, how many recent requests had it
// as their longest prefix held anywhere (keyed by the block ending it,
// halved every demandWindow requests) and hands the policy that share as
// Request.Demand.
//
// The counts are exact: a table keyed by the block's placed hash (the
// index's secret permutation of it, see index.go), so no one can aim
// collisions at it, and so that the counts, and with them the routing
// decisions, do not depend on the secret. Halving bounds how many prefixes
// it counts at once: the counts sum to at most demandWindow more than half
// their sum at the previous halving, so never to more than 2·demandWindow,
// and a prefix whose count halves to zero is forgotten. The table of
// demandSlots = 4·demandWindow slots is therefore at most half full, and a
// lookup probes at most demandProbe slots (a prefix that cannot be placed
// within them, which only someone who knows the secret can arrange, goes
// uncounted).

const (
	demandBits   = 12
	demandSlots  = 1 << demandBits // table slots
	demandWindow = demandSlots / 4 // requests between halvings: 1024
	demandProbe  = 256             // most slots a lookup probes
	// demandPrior is the fewest requests a share is taken of: until the
	// gateway has seen that many, a prefix shared by a few of them is not
	// yet hot (two requests of two are not half the traffic).
	demandPrior = 16
)

// demand counts longest-held prefixes over a decaying window. It is not
// safe for concurrent use; Gateway guards it with its mutex. The zero
// value is empty.
type demand struct {
	keys   [demandSlots]uint64 // placed hash of the block ending the prefix
	counts [demandSlots]uint32 // 0 marks an empty slot
	total  uint32              // requests, decayed alike
	n      int                 // requests since the last halving
}

// observe counts a request whose longest prefix held by a candidate ends
// in block mk[longest-1] (mk holds placed hashes) and returns that
// prefix's share of recent requests, 0..1 (0 when longest is 0), taken of
// at least demandPrior requests: peek, then count.
func (d *demand) observe(mk Key, longest int) float64 {
	share, at := d.peek(mk, longest)
	d.count(at)
	return share
}

// demandAt is where peek found a request's prefix: the slot counting it
// (found) or the empty slot it would take, -1 for none (no prefix, or no
// slot within demandProbe), and the prefix's placed hash.
type demandAt struct {
	i     int
	found bool
	key   uint64
}

// peek returns what observe(mk, longest) would, without counting, and
// where count is to count it: Route hands the share to the policy and
// counts the request only once the policy's pick is valid, so that a call
// that fails leaves the counts as they were. Nothing may change d between
// the two.
func (d *demand) peek(mk Key, longest int) (float64, demandAt) {
	if longest == 0 {
		return 0, demandAt{i: -1}
	}
	at := demandAt{key: mk[longest-1]}
	at.i, at.found = d.slot(at.key)
	if at.i < 0 {
		return 0, at
	}
	c := uint32(1)
	if at.found {
		c += d.counts[at.i]
	}
	return shareOf(c, d.total+1), at
}

// count counts the request peek found at at. The halving due before the
// next request is done after counting this one, so that peek never has
// one to do.
func (d *demand) count(at demandAt) {
	d.total++
	if at.i >= 0 {
		if !at.found {
			d.keys[at.i] = at.key
		}
		d.counts[at.i]++
	}
	if d.n++; d.n == demandWindow {
		d.n = 0
	}
	if d.n == demandWindow-1 { // every demandWindow requests
		d.halve()
	}
}

// share is observe without counting: mk[:longest]'s share so far.
func (d *demand) share(mk Key, longest int) float64 {
	if longest == 0 {
		return 0
	}
	i, ok := d.slot(mk[longest-1])
	if !ok {
		return 0
	}
	return d.ratio(d.counts[i])
}

func demandHome(m uint64) int { return int(m >> (64 - demandBits)) }

// slot returns the slot counting prefix m and true, or the empty slot
// where it would go and false, or -1 when neither lies within demandProbe
// slots of its home.
func (d *demand) slot(m uint64) (int, bool) {
	i := demandHome(m)
	for range demandProbe {
		switch {
		case d.counts[i] == 0:
			return i, false
		case d.keys[i] == m:
			return i, true
		}
		i = (i + 1) & (demandSlots - 1)
	}
	return -1, false
}

// halve halves every count and total, forgetting prefixes whose count
// reaches zero. The survivors are rehashed in place, in slot order from a
// slot that was empty (so that no probe run wraps past it), each to the
// first empty slot from its home, which is never after its old slot.
func (d *demand) halve() {
	d.total /= 2
	e := 0
	for e < demandSlots-1 && d.counts[e] != 0 { // the table is at most half full
		e++
	}
	for k := 1; k <= demandSlots; k++ {
		i := (e + k) & (demandSlots - 1)
		c := d.counts[i] / 2
		if d.counts[i] == 0 {
			continue
		}
		d.counts[i] = 0
		if c == 0 {
			continue
		}
		if j, _ := d.slot(d.keys[i]); j >= 0 {
			d.keys[j], d.counts[j] = d.keys[i], c
		}
	}
}

// ratio is the share of a prefix counted c times.
func (d *demand) ratio(c uint32) float64 { return shareOf(c, d.total) }

// shareOf is the share of a prefix counted c times of total requests.
func shareOf(c, total uint32) float64 {
	return float64(min(c, total)) / float64(max(total, demandPrior))
}
