package fleet

import (
	"testing"

	"pgregory.net/rapid"
)

// TestPeerCapProperties: a peer's report is taken beyond its least, up to
// half own (this gateway's own mean pending prefill per replica of the
// pool), never more than reported, nothing while own is none, and more of
// it as own or reported grow; a level the peer adds at every replica
// changes nothing. A peer never adds more than half own (rounded up),
// whatever it reports.
func TestPeerCapProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		own := rapid.IntRange(-10, MaxLoadCount).Draw(t, "own")
		least := rapid.IntRange(-10, MaxLoadCount).Draw(t, "least")
		rep := max(least, 0) + rapid.IntRange(0, MaxLoadCount).Draw(t, "reported beyond least")
		got := PeerCap(own, rep, least)
		o := max(own, 0)
		switch {
		case got < 0 || got > rep:
			t.Fatalf("PeerCap(%d, %d, %d) = %d: outside 0..reported", own, rep, least, got)
		case o+got > o+(o+1)/2:
			t.Fatalf("PeerCap(%d, %d, %d) = %d: over half of own", own, rep, least, got)
		case own <= 0 && got != 0:
			t.Fatalf("PeerCap(%d, %d, %d) = %d: a replica without own pending prefill", own, rep, least, got)
		case 2*(rep-max(least, 0)) <= own && got != rep-max(least, 0):
			t.Fatalf("PeerCap(%d, %d, %d) = %d: a difference within the cap is taken whole", own, rep, least, got)
		}
		lvl := rapid.IntRange(0, 1000).Draw(t, "level")
		if l := max(least, 0); PeerCap(own, rep+lvl, l+lvl) != got {
			t.Fatalf("PeerCap(%d, %d, %d) = %d, but %d with %d added at every replica", own, rep, l, got, PeerCap(own, rep+lvl, l+lvl), lvl)
		}
		more := rapid.IntRange(0, 1000).Draw(t, "more")
		if PeerCap(own+more, rep, least) < got || PeerCap(own, rep+more, least) < got {
			t.Fatalf("PeerCap(%d, %d, %d) = %d, but less with %d more own or reported", own, rep, least, got, more)
		}
	})
}

func TestPeerCap(t *testing.T) {
	for _, tc := range []struct{ own, rep, least, want int }{
		{0, 4096, 0, 0}, {1, 4096, 0, 1}, {32, 2e9, 0, 16}, {33, 2e9, 0, 17}, {300, 100, 0, 100}, {300, 151, 0, 150},
		{40, 50, 40, 10}, {40, 40, 40, 0}, {40, 2e9, 2e9 - 5, 5}, {-5, 10, 0, 0}, {10, -5, 0, 0}, {10, 8, -3, 5},
	} {
		if got := PeerCap(tc.own, tc.rep, tc.least); got != tc.want {
			t.Errorf("PeerCap(%d, %d, %d) = %d, want %d", tc.own, tc.rep, tc.least, got, tc.want)
		}
	}
}
