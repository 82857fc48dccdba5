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
// as their longest prefix held anywhere (a count-min sketch of the block
// ending it, halved every demandWindow requests) and hands the policy that
// share as Request.Demand.

const (
	demandSlots  = 4096 // per row; a power of two
	demandWindow = 1024 // requests between halvings
	// demandPrior is the fewest requests a share is taken of: until the
	// gateway has seen that many, a prefix shared by a few of them is not
	// yet hot (two requests of two are not half the traffic).
	demandPrior = 16
)

// demand is a decaying count-min sketch of longest-held prefixes. It is not
// safe for concurrent use; Gateway guards it with its mutex.
type demand struct {
	rows  [2][demandSlots]uint32
	total uint32 // requests, decayed alike
	n     int    // requests since the last halving
}

// observe counts a request whose longest prefix held by a candidate is
// key[:longest] and returns that prefix's share of recent requests, 0..1
// (0 when longest is 0), taken of at least demandPrior requests.
func (d *demand) observe(key Key, longest int) float64 {
	if d.n++; d.n == demandWindow {
		d.n = 0
		d.total /= 2
		for r := range d.rows {
			for i := range d.rows[r] {
				d.rows[r][i] /= 2
			}
		}
	}
	d.total++
	if longest == 0 {
		return 0
	}
	a, b := d.counters(key[longest-1])
	*a++
	*b++
	return d.ratio(*a, *b)
}

// share is observe without counting: key[:longest]'s share so far.
func (d *demand) share(key Key, longest int) float64 {
	if longest == 0 {
		return 0
	}
	a, b := d.counters(key[longest-1])
	return d.ratio(*a, *b)
}

// counters returns the two counters of the prefix ending in block h.
func (d *demand) counters(h uint64) (*uint32, *uint32) {
	return &d.rows[0][h&(demandSlots-1)], &d.rows[1][(h>>32)&(demandSlots-1)]
}

// ratio is the share of a prefix counted a and b times in the two rows.
func (d *demand) ratio(a, b uint32) float64 {
	return float64(min(a, b, d.total)) / float64(max(d.total, demandPrior))
}
