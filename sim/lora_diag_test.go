package sim

import (
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/require"
)

// choiceLog wraps a policy and counts the requests it sent to wait for a
// slot (the adapter not in the batch there and no slot free), with the
// state of the candidates that could have taken it at once.
type choiceLog struct {
	gateway.Policy
	waitPicks, picks int
	freeBusier       int // of waitPicks: a no-wait candidate existed
	inBatchAvail     int // of waitPicks: the adapter was in the batch elsewhere
	byAdapter        map[string]int
}

func (c *choiceLog) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	i := c.Policy.Pick(req, cands)
	if req.Adapter == "" {
		return i
	}
	c.picks++
	l := &cands[i].LoRA
	if !inBatch(l) && (l.Waiting || !freeSlot(l)) {
		c.waitPicks++
		c.byAdapter[req.Adapter]++
		for j := range cands {
			o := &cands[j].LoRA
			if inBatch(o) {
				c.inBatchAvail++
				break
			}
		}
		for j := range cands {
			o := &cands[j].LoRA
			if !o.Waiting && freeSlot(o) {
				c.freeBusier++
				break
			}
		}
	}
	return i
}

// TestLoRAOverloadDiag explains cache-aware's p99 on the lora workload
// at overload: it runs one engine and, after every arrival, records each
// request that waits for a slot, its adapter and how long it has waited.
// EXA_LORA_DIAG=1 go test ./sim -run TestLoRAOverloadDiag -v
func TestLoRAOverloadDiag(t *testing.T) {
	if os.Getenv("EXA_LORA_DIAG") == "" {
		t.Skip("diagnostic: set EXA_LORA_DIAG=1")
	}
	w, err := LoRAWorkload(LoRAConfig{Requests: 10000, Rate: 120})
	require.NoError(t, err)
	seed := uint64(1)
	if s, err := strconv.ParseUint(os.Getenv("EXA_LORA_DIAG_SEED"), 10, 64); err == nil {
		seed = s
	}
	log := &choiceLog{Policy: &gateway.CacheAware{}, byAdapter: map[string]int{}}
	cfg := Config{Workload: w, Seed: seed, Replicas: 8,
		Policies: []Policy{{Name: "cache_aware", New: func(uint64) gateway.Policy { return log }}}}
	e, st := openEngine(t, cfg, cfg.Policies[0])
	type waiter struct {
		adapter string
		rep     int
		since   int64
		seen    int64
		blocker []string
	}
	waiters := map[*seq]*waiter{}
	var done []*waiter
	tick := func() {
		live := map[*seq]bool{}
		for ri, r := range e.reps {
			for k := range r.waiting.size {
				s := r.waiting.buf[(r.waiting.head+k)%len(r.waiting.buf)]
				if s.skipped < 0 {
					continue
				}
				live[s] = true
				w := waiters[s]
				if w == nil || w.since != s.skipped {
					if w != nil {
						done = append(done, w)
					}
					var blk []string
					for id, n := range r.lora.running {
						if n > 0 {
							blk = append(blk, e.lora.names[id])
						}
					}
					w = &waiter{adapter: e.lora.names[s.adapter], rep: ri, since: s.skipped, blocker: blk}
					waiters[s] = w
				}
				w.seen = e.now
			}
		}
		for s, w := range waiters {
			if !live[s] {
				done = append(done, w)
				delete(waiters, s)
			}
		}
	}
	require.NoError(t, e.run(st, tick))
	for _, w := range waiters {
		done = append(done, w)
	}
	res := e.result()
	t.Logf("TTFT mean %.2fs p99 %.2fs; %d adapter requests, %d slot waits (engine), mean %.2fs",
		res.TTFT.Mean, res.TTFT.P99, e.lora.requests, e.lora.waits, e.lora.waitSum/float64(max(1, e.lora.waits)))
	t.Logf("policy: %d picks, %d sent to wait for a slot (%d with the adapter in a batch elsewhere, %d with a free slot elsewhere), by adapter %v",
		log.picks, log.waitPicks, log.inBatchAvail, log.freeBusier, log.byAdapter)
	perAd := map[string][]float64{}
	blockers := map[string]int{}
	perRep := map[int]int{}
	for _, w := range done {
		perAd[w.adapter] = append(perAd[w.adapter], float64(w.seen-w.since)/1e9)
		for _, b := range w.blocker {
			blockers[b]++
		}
		perRep[w.rep]++
	}
	for a, ws := range perAd {
		slices.Sort(ws)
		t.Logf("adapter %-8s waited %4d times (observed): median %.2fs max %.2fs", a, len(ws), ws[len(ws)/2], ws[len(ws)-1])
	}
	t.Logf("blocking adapters (running where they waited): %v; waits per replica %v", blockers, perRep)
	for ri, r := range e.reps {
		t.Logf("replica %d: %d requests, %d loads, slots %v", ri, r.requests, r.lora.loads, r.lora.slots)
	}
}

// inBatch and freeSlot read a replica's adapter state as CacheAware does:
// the adapter is (or is about to be) in the running batch; another adapter
// could take a slot at once.
func inBatch(s *gateway.LoRAState) bool  { return s.Running || (s.Routed > 0 && !s.Waiting) }
func freeSlot(s *gateway.LoRAState) bool { return s.MaxLoras == 0 || s.Active < s.MaxLoras }
