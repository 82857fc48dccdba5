package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/memtest"
)

// The memory figures of docs/kv-events.md ("Security"), measured with
//
//	EXA_MEASURE_MEMORY=1 go test ./kvevents -run TestMeasureMemory -v
//
// They are printed, not asserted: heap sizes vary with the Go version.

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// nopIndex accepts every event and keeps nothing: the engine's own
// state is measured, not the gateway's index.
type nopIndex struct{}

func (nopIndex) ApplyEvent(string, gateway.CacheEvent) error { return nil }

func TestMeasureMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE_MEMORY") == "" {
		t.Skip("set EXA_MEASURE_MEMORY=1 to measure")
	}
	t.Run("engine", func(t *testing.T) {
		for _, bound := range []int{4 * 16384, DefaultMaxMapped} {
			before := heapNow()
			tr := NewTranslator(func(s Source) (Target, error) {
				return Target{Index: nopIndex{}, Replica: s.Pod, MaxBlocks: bound}, nil
			}, Limits{})
			const per = 256 // blocks per event
			tokens := seqTokens(1, per*16)
			hashes := make([]uint64, per)
			for seq := 1; seq <= bound/per; seq++ {
				for i := range hashes {
					hashes[i] = uint64(seq*per + i)
				}
				tr.Handle("e", frames(topicA, uint64(seq), pack(t, arrayBatch(stored{hashes: hashes, tokens: tokens, bs: 16}.array()))))
			}
			st, _ := tr.Stats()
			after := heapNow()
			t.Logf("one engine at its bound of %d mapped blocks (mapped %d, overflows %d): %.1f MiB, %.0f bytes a block",
				bound, st[0].Mapped, st[0].Overflows, float64(after-before)/(1<<20), float64(after-before)/float64(st[0].Mapped))
			runtime.KeepAlive(tr)
		}
	})
	t.Run("all engines", func(t *testing.T) {
		// 16 engines, each bounded by DefaultMaxMapped, announcing
		// blocks without end: their maps together at MaxMapped (the
		// default), and, for comparison, without it (a bound past
		// their sum, as before it existed).
		const engines, per = 16, 256
		for _, total := range []int{DefaultMaxMappedTotal, engines * DefaultMaxMapped} {
			before := heapNow()
			tr := NewTranslator(func(s Source) (Target, error) {
				return Target{Index: nopIndex{}, Replica: s.Pod, MaxBlocks: DefaultMaxMapped}, nil
			}, Limits{MaxMapped: total})
			tokens := seqTokens(1, per*16)
			hashes := make([]uint64, per)
			rss := memtest.PeakRSS(func() {
				for seq := 1; seq <= DefaultMaxMapped/per; seq++ {
					for g := range engines {
						for i := range hashes {
							hashes[i] = uint64(g)<<40 | uint64(seq*per+i)
						}
						tr.Handle("e", frames(fmt.Sprintf("kv@pod-%d@m", g), uint64(seq), pack(t, arrayBatch(stored{hashes: hashes, tokens: tokens, bs: 16}.array()))))
					}
				}
			})
			t.Logf("peak RSS of the flood: +%.1f MiB", float64(rss)/(1<<20))
			st, glob := tr.Stats()
			var clears uint64
			for _, e := range st {
				clears += e.BudgetClears
			}
			after := heapNow()
			t.Logf("%d engines of %d blocks each, all bounded by %d: %d mapped, %d budget clears: %.1f MiB, %.0f bytes a block",
				engines, DefaultMaxMapped, total, glob.Mapped, clears, float64(after-before)/(1<<20), float64(after-before)/float64(glob.Mapped))
			runtime.KeepAlive(tr)
		}
	})
	t.Run("stalled connections", func(t *testing.T) {
		const conns = 32
		tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
		sub := NewSubscriber(tr, Options{MessageTimeout: time.Minute, MaxConnsPerHost: 64})
		defer sub.Close()
		addr, err := sub.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		before := heapNow()
		for range conns {
			c := zmtpPeer(t, addr.String())
			hdr := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0, 'x'} // a frame of the largest size, 1 byte of it
			binary.BigEndian.PutUint64(hdr[1:9], DefaultMaxMessageBytes)
			if _, err := c.Write(hdr); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "all open", func() bool { return sub.Endpoints()[0].Guard.Open == conns })
		after := settle()
		t.Logf("%d connections each announcing a %d-byte frame and stalling: %.1f MiB, %.2f MiB a connection",
			conns, DefaultMaxMessageBytes, float64(after-before)/(1<<20), float64(after-before)/conns/(1<<20))
		empty := settleConns(t, addr.String(), conns)
		t.Logf("%d connections idle after their handshake: %.1f KiB a connection", conns, empty/1024)
	})
	t.Run("connections in their handshake", func(t *testing.T) {
		const conns = DefaultMaxConns
		tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
		sub := NewSubscriber(tr, Options{HandshakeTimeout: time.Minute, MaxConnsPerHost: conns})
		defer sub.Close()
		addr, err := sub.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		before := heapNow()
		for range conns {
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			// A greeting, then a command announced one byte longer than
			// the handshake may be, all but its last bytes sent.
			b := append(libGreeting[:], 0x06)
			b = binary.BigEndian.AppendUint64(b, maxHandshakeBytes)
			if _, err := c.Write(append(b, make([]byte, maxHandshakeBytes-len(b)-1)...)); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "all open", func() bool { return sub.Endpoints()[0].Guard.Open == conns })
		after := settle()
		t.Logf("%d connections stalling at the end of their handshake: %.2f MiB, %.1f KiB a connection",
			conns, float64(after-before)/(1<<20), float64(after-before)/conns/1024)
	})
	t.Run("flood with a stalled consumer", func(t *testing.T) {
		const conns, size = 8, DefaultMaxMessageBytes - 64
		hold := make(chan struct{})
		tr := NewTranslator(func(s Source) (Target, error) {
			<-hold // the consumer stalls: the library's queue fills
			return Target{}, fmt.Errorf("no")
		}, Limits{})
		sub := NewSubscriber(tr, Options{MessageTimeout: time.Minute, MaxConnsPerHost: 64})
		defer sub.Close()
		defer close(hold)
		addr, err := sub.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		before := heapNow()
		payload := make([]byte, size)
		for range conns {
			c := zmtpPeer(t, addr.String())
			go func() {
				for range 4 {
					var b []byte
					b = append(b, 1, 1, 't', 1, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0x02)
					b = binary.BigEndian.AppendUint64(b, uint64(len(payload)))
					if _, err := c.Write(append(b, payload...)); err != nil {
						return
					}
				}
			}()
		}
		after := settle()
		t.Logf("%d connections flooding %d-byte messages, consumer stalled: %.1f MiB (%.1f messages held; bound 10 + 1 + 2 x %d = %d)",
			conns, size, float64(after-before)/(1<<20), float64(after-before)/float64(size), conns, 11+2*conns)
	})
}

// settle polls the heap until it stops growing and returns it.
func settle() uint64 {
	last := heapNow()
	for stable := 0; stable < 5; {
		time.Sleep(100 * time.Millisecond)
		now := heapNow()
		if now <= last+(64<<10) {
			stable++
		} else {
			stable = 0
		}
		last = max(last, now)
	}
	return last
}

// settleConns opens n idle connections and returns the heap per
// connection.
func settleConns(t *testing.T, addr string, n int) float64 {
	before := heapNow()
	var cs []net.Conn
	for range n {
		cs = append(cs, zmtpPeer(t, addr))
	}
	after := settle()
	runtime.KeepAlive(cs)
	return float64(after-before) / float64(n)
}

// fixedTokenizer answers every request with n tokens.
type fixedTokenizer int

func (n fixedTokenizer) Tokenize(context.Context, TokenizeRequest) ([]uint32, error) {
	return make([]uint32, n), nil
}

// TestMeasureTokenCache measures the cache of tokenized requests filled
// with distinct requests whose answers are short (0 and 1 token): the
// memory of an entry beside its tokens, and what the default bound lets
// the cache hold.
func TestMeasureTokenCache(t *testing.T) {
	if os.Getenv("EXA_MEASURE_MEMORY") == "" {
		t.Skip("set EXA_MEASURE_MEMORY=1 to measure")
	}
	const requests = 1 << 20
	for _, n := range []int{0, 1, 16} {
		before := heapNow()
		c := NewCachedTokenizer(fixedTokenizer(n), CacheOptions{})
		rss := memtest.PeakRSS(func() {
			for i := range requests {
				if _, err := c.Tokenize(context.Background(), TokenizeRequest{Model: "m", Prompt: strconv.Itoa(i)}); err != nil {
					t.Fatal(err)
				}
			}
		})
		t.Logf("peak RSS of the flood: +%.1f MiB", float64(rss)/(1<<20))
		after := heapNow()
		st := c.Stats()
		t.Logf("%d requests answered with %d tokens: %d entries, %d tokens held: %.1f MiB, %.0f bytes an entry",
			requests, n, st.Entries, st.Tokens, float64(after-before)/(1<<20), float64(after-before)/float64(st.Entries))
		runtime.KeepAlive(c)
	}
}
