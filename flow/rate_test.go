package flow

import (
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/examlops/gateway/internal/memtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropRate: Rate.Admit, over any sequence of request times, admits at
// most Burst + L/interval requests in any window of length L; admits
// every request of a client that sends at most one an interval; and a
// request refused with a wait w is admitted at now+w.
func TestPropRate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := Rate{PerSecond: rapid.Float64Range(0.5, 5000).Draw(t, "perSecond"), Burst: rapid.IntRange(1, 20).Draw(t, "burst")}
		iv := r.interval()
		n := rapid.IntRange(1, 300).Draw(t, "n")
		var tat, now int64
		var admitted []int64
		for i := range n {
			now += rapid.Int64Range(0, 3*iv).Draw(t, "gap")
			next, wait := r.Admit(tat, now)
			if wait == 0 {
				admitted = append(admitted, now)
				tat = next
				continue
			}
			if next != tat {
				t.Fatalf("request %d refused but tat moved from %d to %d", i, tat, next)
			}
			if _, w2 := r.Admit(tat, now+int64(wait)); w2 != 0 {
				t.Fatalf("request %d refused with wait %v, still refused then (%v)", i, wait, w2)
			}
			if _, w2 := r.Admit(tat, now+int64(wait)-1); w2 == 0 {
				t.Fatalf("request %d refused with wait %v, admitted a nanosecond sooner", i, wait)
			}
		}
		for i := range admitted {
			for j := i; j < len(admitted); j++ {
				if count, bound := int64(j-i+1), int64(r.Burst)+(admitted[j]-admitted[i])/iv; count > bound {
					t.Fatalf("%d admitted in %d ns, bound %d (interval %d, burst %d)", count, admitted[j]-admitted[i], bound, iv, r.Burst)
				}
			}
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		r := Rate{PerSecond: rapid.Float64Range(0.5, 5000).Draw(t, "perSecond"), Burst: rapid.IntRange(1, 20).Draw(t, "burst")}
		iv := r.interval()
		var tat, now int64
		for i := range rapid.IntRange(1, 200).Draw(t, "n") {
			now += rapid.Int64Range(iv, 5*iv).Draw(t, "gap")
			next, wait := r.Admit(tat, now)
			if wait != 0 {
				t.Fatalf("request %d, %d ns after the last, refused", i, iv)
			}
			tat = next
		}
	})
}

func TestRateBurst(t *testing.T) {
	r := Rate{PerSecond: 10, Burst: 3}
	var tat int64
	for i := range 3 {
		next, wait := r.Admit(tat, 0)
		require.Zero(t, wait, "request %d of the burst", i)
		tat = next
	}
	_, wait := r.Admit(tat, 0)
	require.Equal(t, 100*time.Millisecond, wait, "the fourth waits one interval")
	next, wait := Rate{}.Admit(5, 0)
	require.Zero(t, wait, "the zero Rate limits nothing")
	require.EqualValues(t, 5, next)
	_, wait = Rate{PerSecond: 1, Burst: 1 << 62}.Admit(0, 0)
	require.Zero(t, wait, "a huge burst does not overflow")
}

func TestRateLimitValidate(t *testing.T) {
	for _, tc := range []struct {
		o    RateLimit
		want string
	}{
		{RateLimit{Rate: Rate{PerSecond: -1, Burst: 1}}, "Rate.PerSecond -1"},
		{RateLimit{Rate: Rate{PerSecond: 1}}, "Rate.Burst 0: want at least 1"},
		{RateLimit{Rate: Rate{PerSecond: 1e-9, Burst: 1}}, "Rate.PerSecond 1e-09"},
		{RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, Key: "cookie"}, `RateLimit.Key "cookie": want ip or header:NAME`},
		{RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, Key: "header:"}, `RateLimit.Key "header:"`},
		{RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, Key: "header:a b"}, `RateLimit.Key "header:a b"`},
		{RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, MaxClients: -1}, "RateLimit.MaxClients -1 is negative"},
	} {
		_, err := NewRateLimiter(tc.o)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, tc.want)
	}
	l, err := NewRateLimiter(RateLimit{})
	require.NoError(t, err)
	require.Nil(t, l, "off")
	ok, _ := l.Allow(1, time.Now())
	require.True(t, ok, "a nil limiter admits")
}

// TestRateLimiterClients: clients are told apart by the header Key names,
// else by IP address (not port); each has its own burst.
func TestRateLimiterClients(t *testing.T) {
	l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 1, Burst: 2}, Key: "header:X-Api-Key"})
	require.NoError(t, err)
	a := http.Header{"X-Api-Key": {"a"}}
	b := http.Header{"X-Api-Key": {"b"}}
	none := http.Header{}
	require.Equal(t, l.Client(none, "10.0.0.1:1000"), l.Client(none, "10.0.0.1:2000"), "one address, two ports")
	require.Equal(t, l.Client(none, "10.0.0.1:1000"), l.Client(none, "[::ffff:10.0.0.1]:3"), "IPv4 mapped")
	require.NotEqual(t, l.Client(none, "10.0.0.1:1000"), l.Client(none, "10.0.0.2:1000"))
	require.Equal(t, l.Client(none, "[2001:db8:1:2::1]:443"), l.Client(none, "[2001:db8:1:2:ffff:1:2:3]:80"), "one IPv6 /64")
	require.NotEqual(t, l.Client(none, "[2001:db8:1:2::1]:443"), l.Client(none, "[2001:db8:1:3::1]:443"), "another /64")
	require.Equal(t, l.Client(none, "[fe80::1%eth0]:1"), l.Client(none, "fe80::2"), "zoned, and without a port")
	require.Equal(t, l.Client(a, "10.0.0.1:1"), l.Client(a, "10.0.0.2:1"), "the header, wherever from")
	require.NotEqual(t, l.Client(a, "10.0.0.1:1"), l.Client(b, "10.0.0.1:1"))
	now := time.Now()
	for _, c := range []uint64{l.Client(a, ""), l.Client(b, ""), l.Client(none, "10.0.0.1:1")} {
		for i := range 2 {
			ok, _ := l.Allow(c, now)
			require.True(t, ok, "request %d of its burst", i)
		}
		ok, wait := l.Allow(c, now)
		require.False(t, ok)
		require.Equal(t, time.Second, wait)
	}
	require.Equal(t, RateLimiterStats{Clients: 3, Limited: 3}, l.Stats())
}

// TestPropRateLimiterBounded: however many clients, at most MaxClients
// are kept; a client whose burst is whole again is dropped before any
// other; a client sending at most one request an interval is always
// admitted.
func TestPropRateLimiterBounded(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxClients := rapid.IntRange(1, 20).Draw(t, "max")
		l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 100, Burst: rapid.IntRange(1, 4).Draw(t, "burst")}, MaxClients: maxClients})
		if err != nil {
			t.Fatal(err)
		}
		now := l.epoch
		var polite time.Time // client 0 sends one request every 10 ms at most
		for i := range rapid.IntRange(1, 400).Draw(t, "n") {
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(5*time.Millisecond)).Draw(t, "gap")))
			c := rapid.Uint64Range(0, 40).Draw(t, "client")
			if c == 0 {
				if !polite.IsZero() && now.Sub(polite) < 10*time.Millisecond {
					continue
				}
				polite = now
			}
			forgot := l.Stats().Forgotten
			idle := 0
			for _, tat := range l.tats {
				if tat <= now.Sub(l.epoch).Nanoseconds() {
					idle++
				}
			}
			ok, _ := l.Allow(c, now)
			if c == 0 && !ok {
				t.Fatalf("request %d of the polite client refused", i)
			}
			if n := len(l.tats); n > maxClients {
				t.Fatalf("%d clients kept, bound %d", n, maxClients)
			}
			if l.Stats().Forgotten > forgot && idle > 0 && idle >= evictSample {
				t.Fatalf("a limited client forgotten while %d were idle", idle)
			}
		}
	})
}

// TestMeasureRateLimiterMemory prints the heap a RateLimiter holds with
// DefaultRateClients clients: the figure of docs/security.md.
//
//	EXA_MEASURE=1 go test ./flow -run TestMeasureRateLimiterMemory -count=1 -v
func TestMeasureRateLimiterMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	before := memtest.LiveHeap()
	l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}})
	require.NoError(t, err)
	now := time.Now()
	// A flood of new clients, four times the bound, each seen once: the
	// process's peak RSS over it, beside the heap the table keeps.
	rss := memtest.PeakRSS(func() {
		for i := range 4 * DefaultRateClients {
			l.Allow(uint64(i)*0x9e3779b97f4a7c15, now)
		}
	})
	after := memtest.LiveHeap()
	st := l.Stats()
	t.Logf("%d clients kept of %d seen (%d forgotten): %.2f MiB, %.0f bytes a client; peak RSS over the flood +%.1f MiB", st.Clients, 4*DefaultRateClients, st.Forgotten,
		float64(after-before)/(1<<20), float64(after-before)/float64(st.Clients), float64(rss)/(1<<20))
	runtime.KeepAlive(l)
}

// FuzzClient: any header value and remote address give a key, never a
// panic; a request with the header is keyed by it alone, one without by
// its address, the same for every port and, for IPv6, every address of
// its /64; and a remote address is keyed as the plain parse order
// (host:port, then a bare address, then the string) keys it, which
// Client reorders by the address's shape to spare a failed parse's
// allocation.
func FuzzClient(f *testing.F) {
	for _, s := range [][2]string{{"", "10.0.0.1:1"}, {"sk-1", "[2001:db8::1]:443"}, {"", "[fe80::1%eth0]:1"}, {"", "not an address"}, {"", ""}, {"", "[::ffff:10.0.0.1]:2"},
		{"", "192.0.2.1"}, {"", "2001:db8::1"}, {"", "fe80::1%eth0"}, {"", "::ffff:10.0.0.1"}, {"", "1:2"}, {"", "[::1]"}} {
		f.Add(s[0], s[1])
	}
	l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, Key: "header:X-Api-Key"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key, remote string) {
		h := http.Header{}
		if key != "" {
			h.Set("X-Api-Key", key)
		}
		c := l.Client(h, remote)
		if h.Get("X-Api-Key") == "" {
			want := xxhash.Sum64String(remote)
			if ap, err := netip.ParseAddrPort(remote); err == nil {
				want = addrClient(ap.Addr())
			} else if a, err := netip.ParseAddr(remote); err == nil {
				want = addrClient(a)
			}
			if c != want {
				t.Fatalf("%q: keyed %x, the plain parse order %x", remote, c, want)
			}
		}
		if h.Get("X-Api-Key") != "" {
			if c != l.Client(h, "elsewhere") {
				t.Fatalf("key %q: the address changed its client", key)
			}
			return
		}
		ap, err := netip.ParseAddrPort(remote)
		if err != nil {
			return
		}
		other := netip.AddrPortFrom(ap.Addr(), ap.Port()+1).String()
		if l.Client(h, other) != c {
			t.Fatalf("%s and %s: two clients", remote, other)
		}
		if a := ap.Addr().Unmap(); a.Is6() {
			b := a.As16()
			b[15] ^= 1
			if l.Client(h, netip.AddrFrom16(b).String()) != c {
				t.Fatalf("%s: another address of its /64 is another client", remote)
			}
		}
	})
}

// Client allocates nothing for an address with or without its port, of
// either family, nor for a header's value.
func TestClientAllocatesNothing(t *testing.T) {
	l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 1, Burst: 1}, Key: "header:X-Api-Key"})
	require.NoError(t, err)
	h, keyed := http.Header{}, http.Header{"X-Api-Key": {"sk-1"}}
	for _, remote := range []string{"192.0.2.1", "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]:443"} {
		if n := testing.AllocsPerRun(100, func() { l.Client(h, remote) }); n != 0 {
			t.Errorf("%s: %v allocations", remote, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { l.Client(keyed, "192.0.2.1") }); n != 0 {
		t.Errorf("by header: %v allocations", n)
	}
}
