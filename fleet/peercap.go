package fleet

// PeerCap returns how much of a peer gateway's report of pending prefill
// at a replica this gateway takes: what the peer reports there (reported,
// in blocks) beyond the least it reports at any replica of the same pool
// (least; a replica it does not report counts 0), at most half this
// gateway's own pending prefill at the replica (own, rounded up); so
// nothing at a replica where this gateway has none. Negative inputs count
// as 0.
//
// A peer's report steers routing (cache_aware prices a replica by its
// pending prefill, its own plus its peers') and cannot be checked. With
// this cap a peer can make a replica look at most 1.5 times as busy as
// this gateway's own traffic made it: it cannot tilt the choice among
// replicas idle here (light load), and under load a replica it lies about
// keeps, in that pricing, a share of 1/(k + 1.5(n−k)) of the requests
// when it lies about k of n replicas: at least two thirds of its fair
// share, 28.6% with two of three (docs/multi-gateway.md). What an honest
// peer's report says about the choice among replicas is how much more it
// has queued at one than at another; that is what is taken, so that
// gateways carrying similar traffic hear each other's differences in
// full (up to half their own) rather than have their reports cut where
// they are highest. The cost: an idle gateway hears nothing, and the
// peers' common level is not added.
func PeerCap(own, reported, least int) int {
	if own <= 0 {
		return 0
	}
	return min(max(reported-max(least, 0), 0), own-own/2)
}
