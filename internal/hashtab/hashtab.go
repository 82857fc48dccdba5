// Package hashtab is the module's one hash-table core: ordered
// open-addressing tables with bounded probes and shifts, placed by a
// secret. The prefix index of package gateway (its block table and every
// replica's table) and the simulator's tables (package sim) all probe,
// insert and delete through the functions of this file; Map is a ready
// table built on them.
//
// An ordered hash table (Amble and Knuth 1974) keeps linear probing's runs
// sorted by key. Keys are placed hashes, 64-bit values spread uniformly by
// a secret (Seed): the home slot of key m among n home slots is the top
// bits of m scaled to n (Home), so homes ascend with the keys, and keeping
// each run sorted keeps every occupied slot in ascending order of key and
// of home: Robin Hood placement, ties broken by key. MaxProbe spare slots
// follow the n homes, so that no run wraps around. A probe stops at the
// first slot whose key is not below the one sought: a lookup for an absent
// key ends about as soon as one for a present key, one comparison a slot.
//
// The work of one operation is bounded whatever the keys:
//
//   - no key sits MaxProbe (128) or more slots past its home, so a lookup
//     probes at most MaxProbe slots;
//   - an insertion scans and shifts at most MaxShift (4,096) slots;
//   - a key that cannot be placed within these bounds is not inserted
//     (Room reports it; each table decides what that means).
//
// Deletion shifts back the rest of the run, up to its end or to a key at
// its home: as long as the runs random placement makes, not capped.
//
// With keys placed by a secret the bounds are far from reached (package
// gateway's TestPlacementStatistics: at load 0.85 over 1.2M slots, the
// largest distance from home is about 40 slots and the longest run about
// 600), so only someone who knows the secret can choose keys that hit
// them.
//
// The functions read a table only through a Slot function, so each table
// keeps its own layout (a key beside its value, or a key reached through a
// node), and moves its slots itself (a copy). Find, Seat, Room and Delete
// are small enough for the compiler to inline, and the Slot function
// literal with them: a table calling them compiles to the loop it would
// have written by hand, without calls (go build -gcflags=-m lists them as
// inlined; TestInlined checks it). A method set would not do: Go compiles
// the methods of a type parameter, or of an interface, into indirect calls
// that the inliner does not see through, one per slot probed.
package hashtab

import "math/bits"

const (
	// MaxProbe bounds a key's distance from its home slot, and so the
	// slots a lookup probes; it is also the number of spare slots that
	// follow the home slots.
	MaxProbe = 128
	// MaxShift bounds the slots an insertion scans for a free slot and
	// shifts to make room.
	MaxShift = 4096
)

// Slot reports the key held in slot i of a table and whether slot i is
// occupied; i is always below Slots(n) of the table's n home slots.
type Slot func(i int) (key uint64, ok bool)

// Home returns the home slot of key m in a table of n home slots: the top
// bits of m scaled to n (Lemire's multiply-shift), ascending with m.
func Home(m uint64, n int) int {
	hi, _ := bits.Mul64(m, uint64(n))
	return int(hi)
}

// Slots is the length of a table of n home slots: the homes, then
// MaxProbe spares.
func Slots(n int) int { return n + MaxProbe }

// Find returns the slot holding key m in a table of n home slots, or -1.
// It probes at most MaxProbe slots, stopping at the first empty slot or
// greater key.
func Find(n int, m uint64, at Slot) int {
	i := Home(m, n)
	for end := i + MaxProbe; i < end; i++ {
		k, ok := at(i)
		if !ok || k > m {
			break
		}
		if k == m {
			return i
		}
	}
	return -1
}

// Insertion takes two steps, each small enough to inline: Seat finds the
// slot i where an absent key goes, Room the first empty slot e from there;
// the caller then moves slots i..e-1 one slot on (to i+1..e) and writes
// the key to slot i:
//
//	i := hashtab.Seat(n, m, at)
//	e := hashtab.Room(n, i, at)
//	if e < 0 {
//		// m does not fit within the bounds: leave the table as it is.
//	}
//
// A table rebuilt by inserting its keys in ascending order (the order of
// its slots) puts each at the end of its run, and so never shifts.

// Seat returns the slot where key m is or goes in a table of n home
// slots: the first slot from its home that is empty or holds m or a
// greater key (a caller that does not know whether m is present compares
// that slot's key with m). It returns -1 if that slot lies MaxProbe or
// more slots past the home: then m is absent and cannot be placed.
func Seat(n int, m uint64, at Slot) int {
	h := Home(m, n)
	for i := h; i < h+MaxProbe; i++ {
		if k, ok := at(i); !ok || k >= m {
			return i
		}
	}
	return -1
}

// Room returns the first empty slot from slot i, the seat of a key being
// inserted, in a table of n home slots: the end of the slots to shift. It
// returns -1 if i is -1, or if the shift would move more than MaxShift
// slots or put a key MaxProbe or more slots past its home (or off the
// table).
func Room(n, i int, at Slot) int {
	for e := i; e >= 0 && e-i <= MaxShift; e++ {
		k, ok := at(e)
		if !ok {
			return e
		}
		if e+1-Home(k, n) >= MaxProbe {
			break
		}
	}
	return -1
}

// Delete returns the end of the run that follows slot i, which the caller
// is emptying, in a table of n home slots: the first slot j after i that
// is empty or holds a key at its home. The caller moves slots i+1..j-1
// back one slot (to i..j-2) and empties slot j-1.
func Delete(n, i int, at Slot) (j int) {
	slots := Slots(n)
	for j = i + 1; j < slots; j++ {
		if k, ok := at(j); !ok || Home(k, n) >= j {
			break
		}
	}
	return j
}
