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
)

// demand is a decaying count-min sketch of longest-held prefixes. It is not
// safe for concurrent use; Gateway guards it with its mutex.
type demand struct {
	rows  [2][demandSlots]uint32
	total uint32 // requests, decayed alike
	n     int    // requests since the last halving
}

// observe counts a request whose longest prefix held by any replica is
// key[:longest] and returns that prefix's share of recent requests, 0..1
// (0 when longest is 0).
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
	h := key[longest-1]
	a := &d.rows[0][h&(demandSlots-1)]
	b := &d.rows[1][(h>>32)&(demandSlots-1)]
	*a++
	*b++
	return float64(min(*a, *b, d.total)) / float64(d.total)
}
