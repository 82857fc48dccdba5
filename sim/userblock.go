package sim

// userStart infers, for trace requests, where the first user message
// begins (Request.UserBlock): traces carry block ids, not messages, and
// KubeAI's CHWBL keys on the first characters of the first user message.
//
// The prompts of a trace form a tree of shared prefixes. A system prompt
// (or template) every conversation starts with is a path without
// branches from the root, and the user messages begin where it first
// branches: the first block at which two requests seen so far differ after
// an equal prefix. A request's UserBlock is the depth of the first
// branching prefix on its path (0 when the very first blocks differ, as
// they do without a system prompt), and 0 until a branch has been seen.
// Later turns of a conversation extend its path and so find the same
// place.
//
// It learns online, in one pass, from the requests before: each request
// adds the prefixes of its path it is the first to take, and the table is
// bounded by maxUserPrefixes, beyond which it stops learning and answers
// from what it knows. Not safe for concurrent use.
type userStart struct {
	// next maps a prefix (the chained hash of its blocks) to the block
	// that followed it first, or to branched once two differed.
	next map[uint64]uint64
}

// maxUserPrefixes bounds userStart's table: 1<<20 prefixes, about 40 MB.
const maxUserPrefixes = 1 << 20

// branched marks a prefix followed by two different blocks.
const branched = ^uint64(0)

// block returns the index of the block where blocks' first user message
// begins, and learns from blocks.
func (u *userStart) block(blocks []uint64) int {
	if u.next == nil {
		u.next = map[uint64]uint64{}
	}
	h := uint64(0x243f6a8885a308d3) // the empty prefix
	for d, b := range blocks {
		nx, ok := u.next[h]
		switch {
		case !ok:
			// A new path: record the rest of it, nothing known beyond.
			for _, b := range blocks[d:] {
				if len(u.next) >= maxUserPrefixes {
					break
				}
				u.next[h] = b
				h = mix(h ^ b)
			}
			return 0
		case nx == branched:
			return d
		case nx != b:
			u.next[h] = branched
			return d
		}
		h = mix(h ^ b)
	}
	return 0
}
