package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// Benchmarks for issue 10's speed targets:
//
//	Ingest:        ≥ 1M blocks applied per second on one core (decode,
//	               rehash, engine-hash map, ApplyEvent on a real Gateway)
//	RouteStreaming: Route while events stream at 100k blocks/s within 1.5×
//	               of Route on the same gateway idle, same run
//
// Run: go test -run '^$' -bench 'Ingest|RouteStreaming' -benchmem -count 6 ./kvevents/

const (
	benchEngines   = 8
	benchChainLen  = 8  // blocks per stored event
	benchWindow    = 64 // live chains per engine: 512 blocks
	benchRing      = 512
	benchBlockSize = 16
)

// threadCPU returns the CPU time the calling OS thread has used. The
// machine is shared, so wall-clock rates understate what one core does;
// the benchmarks lock their goroutine to its thread and report blocks per
// second of that thread's CPU time beside the wall-clock figure.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rate reports blocks per wall-clock second and per CPU second of the
// benchmark's thread (locked with runtime.LockOSThread by the caller).
func rate(b *testing.B, blocks int, wall, cpu time.Duration) {
	b.ReportMetric(float64(blocks)/wall.Seconds(), "blocks/s")
	if cpu > 0 {
		b.ReportMetric(float64(blocks)/cpu.Seconds(), "blocks/cpu-s")
	}
}

// engineStream is one engine's ring of messages: message i stores chain i
// (benchChainLen blocks, a child of chain i-1's last block unless i is a
// multiple of 4, when it starts a new root) and removes chain
// i-benchWindow, so the engine's cache stays at benchWindow chains.
type engineStream struct {
	topic    []byte
	payloads [][]byte
	prompts  [][]uint32 // the tokens of each root's four chains
}

func makeStreams(tb fataler, enc string) []engineStream {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]engineStream, benchEngines)
	for e := range out {
		s := &out[e]
		s.topic = fmt.Appendf(nil, "kv@pod-%d@model", e)
		hash := func(i, j int) uint64 { return uint64(e)<<40 | uint64(i)<<8 | uint64(j) + 1 }
		var prompt []uint32
		for i := range benchRing {
			tokens := make([]uint32, benchChainLen*benchBlockSize)
			for k := range tokens {
				tokens[k] = rng.Uint32N(128000)
			}
			var parent any
			if i%4 != 0 {
				parent = hash(i-1, benchChainLen-1)
			} else {
				prompt = nil
			}
			prompt = append(prompt, tokens...)
			if i%4 == 3 {
				s.prompts = append(s.prompts, prompt)
			}
			hs := make([]uint64, benchChainLen)
			for j := range hs {
				hs[j] = hash(i, j)
			}
			st := stored{hashes: hs, parent: parent, tokens: tokens, bs: benchBlockSize, medium: "GPU"}
			old := (i - benchWindow + benchRing) % benchRing
			rm := make([]uint64, benchChainLen)
			for j := range rm {
				rm[j] = hash(old, j)
			}
			if enc == "maps" {
				s.payloads = append(s.payloads, pack(tb, mapBatch(st.mapped(), removedMap("GPU", rm...))))
			} else {
				s.payloads = append(s.payloads, pack(tb, arrayBatch(st.array(), removedArray("GPU", rm...))))
			}
		}
	}
	return out
}

func benchGateway(tb fataler) *gateway.Gateway {
	reps := make([]gateway.Replica, benchEngines)
	for i := range reps {
		reps[i] = gateway.Replica{Name: fmt.Sprintf("pod-%d", i), CacheBlocks: 4096}
	}
	g, err := gateway.New(reps, gateway.WithMode(gateway.ModeCacheAware), gateway.WithExactIndex())
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// feeder replays the streams in turn, engine by engine, as messages with
// consecutive sequence numbers.
type streamFeeder struct {
	tr      *Translator
	streams []engineStream
	seq     []uint64
	frames  [][]byte
	seqBuf  [8]byte
	n       int
}

func newStreamFeeder(tr *Translator, streams []engineStream) *streamFeeder {
	f := &streamFeeder{tr: tr, streams: streams, seq: make([]uint64, len(streams))}
	f.frames = [][]byte{nil, f.seqBuf[:], nil}
	return f
}

// next sends one message: benchChainLen blocks stored and as many removed
// (none in the first window).
func (f *streamFeeder) next() {
	e := f.n % len(f.streams)
	s := &f.streams[e]
	i := int(f.seq[e] % benchRing)
	f.seq[e]++
	binary.BigEndian.PutUint64(f.seqBuf[:], f.seq[e])
	f.frames[0] = s.topic
	f.frames[2] = s.payloads[i]
	f.tr.Handle("tcp://*:5557", f.frames)
	f.n++
}

func newBenchTranslator(g *gateway.Gateway) *Translator {
	return NewTranslator(func(s Source) (Target, error) {
		return Target{Index: g, Replica: s.Pod, BlockSize: benchBlockSize}, nil
	}, Limits{})
}

// BenchmarkIngest: one op is one message of 8 blocks stored and 8
// removed, through Translator.Handle into a real Gateway (IndexExact, 8
// replicas); blocks/s counts the stored blocks only.
func BenchmarkIngest(b *testing.B) {
	for _, enc := range []string{"arrays", "maps"} {
		b.Run(enc, func(b *testing.B) {
			streams := makeStreams(b, enc)
			g := benchGateway(b)
			f := newStreamFeeder(newBenchTranslator(g), streams)
			for range 2 * benchRing * benchEngines { // reach the steady state
				f.next()
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu := time.Now(), threadCPU()
			for range b.N {
				f.next()
			}
			rate(b, b.N*benchChainLen, time.Since(start), threadCPU()-cpu)
			st, _ := f.tr.Stats()
			for _, s := range st {
				if s.Dropped != 0 || s.Clears != 0 {
					b.Fatalf("engine %s: %d dropped, %d clears: %s", s.Source.Topic, s.Dropped, s.Clears, s.LastError)
				}
			}
		})
	}
}

// BenchmarkDecode is the decoding share of BenchmarkIngest.
func BenchmarkDecode(b *testing.B) {
	streams := makeStreams(b, "arrays")
	d := NewDecoder(Limits{})
	fn := func(*Event, error) {}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), threadCPU()
	for i := range b.N {
		if err := d.Decode(streams[0].payloads[i%benchRing], fn); err != nil {
			b.Fatal(err)
		}
	}
	rate(b, b.N*benchChainLen, time.Since(start), threadCPU()-cpu)
}

// BenchmarkRouteStreaming routes 32-block prompts that every engine's
// events stored once and never remove, on a gateway fed by events: idle,
// and while a goroutine streams the engines' churn (their rings of stored
// and removed chains) at 100k stored blocks/s, as many removed. Compare
// the two sub-benchmarks of the same run.
func BenchmarkRouteStreaming(b *testing.B) {
	streams := makeStreams(b, "arrays")
	g := benchGateway(b)
	tr := newBenchTranslator(g)
	f := newStreamFeeder(tr, streams)
	// The stable prompts: 8 per engine, 32 blocks, stored under hashes the
	// rings never use, each engine holding its own and its neighbour's.
	rng := rand.New(rand.NewPCG(3, 4))
	var ks []gateway.Key
	for e := range streams {
		for p := range 8 {
			tokens := make([]uint32, 32*benchBlockSize)
			for k := range tokens {
				tokens[k] = rng.Uint32N(128000)
			}
			k, err := keys.AppendExact(nil, "model", tokens, benchBlockSize)
			if err != nil {
				b.Fatal(err)
			}
			ks = append(ks, k)
			for _, holder := range []int{e, (e + 1) % len(streams)} {
				hs := make([]uint64, 32)
				for j := range hs {
					hs[j] = 1<<62 | uint64(e)<<32 | uint64(p)<<8 | uint64(j)
				}
				f.seq[holder]++
				tr.Handle("tcp://*:5557", frames(string(streams[holder].topic), f.seq[holder],
					pack(b, arrayBatch(stored{hashes: hs, tokens: tokens, bs: benchBlockSize}.array()))))
			}
		}
	}
	for range benchRing * benchEngines {
		f.next()
	}
	route := func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.ReportAllocs()
		b.ResetTimer()
		cpu := threadCPU()
		defer func() { b.ReportMetric(float64(threadCPU()-cpu)/float64(b.N), "cpu-ns/op") }()
		for i := range b.N {
			d, err := g.Route(ks[i%len(ks)])
			if err != nil {
				b.Fatal(err)
			}
			if d.Matched != 32 {
				b.Fatalf("matched %d of 32 blocks", d.Matched)
			}
			d.Done(gateway.DoneInfo{})
		}
	}
	b.Run("idle", route)
	b.Run("streaming-100k", func(b *testing.B) {
		var stop atomic.Bool
		var wg sync.WaitGroup
		var sent int
		wg.Add(1)
		start := time.Now()
		go func() {
			defer wg.Done()
			// 100k blocks/s is 12,500 messages of 8 blocks a second: every
			// millisecond, send the messages due since the start.
			for !stop.Load() {
				time.Sleep(time.Millisecond)
				due := int(time.Since(start).Seconds() * 100_000 / benchChainLen)
				for ; sent < due; sent++ {
					f.next()
				}
			}
		}()
		route(b)
		elapsed := time.Since(start)
		stop.Store(true)
		wg.Wait()
		b.ReportMetric(float64(sent*benchChainLen)/elapsed.Seconds(), "event-blocks/s")
	})
}

// BenchmarkTokenizeWire: the /tokenize body written and the answer read by
// hand (tokenizewire.go) against encoding/json, which they replace: a
// 40 kB prompt (a line of 80 bytes, or a quote and a line every 28 with
// EXA_DENSE=1), an answer of 10,000 ids.
func BenchmarkTokenizeWire(b *testing.B) {
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.\n", 512)
	if os.Getenv("EXA_DENSE") != "" {
		prompt = strings.Repeat("The quick brown fox \"jumps\"\n", 1430)
	}
	req := TokenizeRequest{Model: "meta-llama/Llama-3.1-8B-Instruct", Prompt: prompt}
	var ans strings.Builder
	ans.WriteString(`{"count":10000,"max_model_len":131072,"tokens":[`)
	for i := range 10000 {
		if i > 0 {
			ans.WriteByte(',')
		}
		ans.WriteString(strconv.Itoa(100 + i*13%128000))
	}
	ans.WriteString(`],"token_strs":null}`)
	answer := []byte(ans.String())
	b.Run("body/ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = appendTokenizeBody(make([]byte, 0, tokenizeBodySize(req)), req)
		}
	})
	b.Run("body/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(tokenizeBody(req)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("answer/ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeTokens(answer, func(int) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("answer/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out struct {
				Tokens *[]uint32 `json:"tokens"`
			}
			if err := json.NewDecoder(bytes.NewReader(answer)).Decode(&out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
