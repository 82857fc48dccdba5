package fleet

// PeerCap returns how much of a peer gateway's report of pending prefill
// at a replica this gateway takes: what the peer reports there (reported,
// in blocks) beyond the least it reports at any replica of the same pool
// (least; a replica it does not report counts 0), at most half own,
// rounded up, where own is this gateway's own pending prefill per replica
// of that pool (the mean over the pool, rounded up); so nothing while this
// gateway has none pending in the pool. Negative inputs count as 0.
//
// A peer's report steers routing (cache_aware prices a replica by its
// pending prefill, its own plus its peers') and cannot be checked. With
// this cap a peer can add to a replica at most half of what this
// gateway's own traffic keeps pending at its average replica: under load,
// where a replica's own pending prefill is near the mean, a replica it
// lies about looks at most about 1.5 times as busy and keeps, in that
// pricing, a share of about 1/(k + 1.5(n−k)) of the requests when it lies
// about k of n replicas (28.6% with two of three). While this gateway has
// a long prompt in prefill at one replica, the mean is large, and a peer
// can then steer short prompts away from a replica idle here, as an
// honest peer with a long prompt queued there would
// (TestLyingPeerLongPromptElsewhere; docs/multi-gateway.md): the honest
// signal that helps is a peer's queue where this gateway has little, and
// a lie looks the same; the peer token keeps liars out. What an honest peer's
// report says about the choice among replicas is how much more it has
// queued at one than at another; that is what is taken. The cap is by
// the pool's mean rather than by this gateway's own pending prefill at
// the replica, as it was: a gateway has little or none pending exactly
// where a peer has queued most, so that cap cut what would steer it away,
// and in the simulator sharing then bought nothing (8 replicas, 2 and 4
// gateways: 704 and 785 ms against 707 and 774 unshared; by the mean:
// 648 and 708 ms). The peers' common level is not added.
func PeerCap(own, reported, least int) int {
	if own <= 0 {
		return 0
	}
	return min(max(reported-max(least, 0), 0), own-own/2)
}
