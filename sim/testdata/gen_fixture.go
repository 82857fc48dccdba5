//go:build ignore

// gen_fixture writes mooncake_fixture.jsonl, a small Mooncake-format trace
// for unit tests: multi-turn sessions whose prompts extend the previous
// turn, Poisson arrivals, 512-token blocks. Run: go run gen_fixture.go
package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

func main() {
	rng := rand.New(rand.NewPCG(42, 7))
	f, err := os.Create("mooncake_fixture.jsonl")
	if err != nil {
		panic(err)
	}
	w := bufio.NewWriter(f)
	type sess struct {
		ids    []int
		tokens int
	}
	var open []*sess
	next, t := 0, 0.0
	for range 300 {
		t += rng.ExpFloat64() * 250 // 4 requests per second
		var s *sess
		if len(open) > 0 && rng.Float64() < 0.6 {
			s = open[rng.IntN(len(open))]
		} else {
			s = &sess{}
			open = append(open, s)
			if len(open) > 24 {
				open = open[1:]
			}
		}
		// Whole blocks of the previous prompt stay; the tail is new.
		full := s.tokens / 512
		s.ids = s.ids[:full]
		s.tokens = full*512 + 200 + rng.IntN(6000)
		for len(s.ids) < (s.tokens+511)/512 {
			s.ids = append(s.ids, next)
			next++
		}
		ids := make([]string, len(s.ids))
		for i, id := range s.ids {
			ids[i] = fmt.Sprint(id)
		}
		fmt.Fprintf(w, "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": %d, \"hash_ids\": [%s]}\n",
			int(t), s.tokens, 20+rng.IntN(300), strings.Join(ids, ", "))
		if s.tokens > 60000 {
			s.ids, s.tokens = nil, 0
		}
	}
	if err := w.Flush(); err != nil {
		panic(err)
	}
	f.Close()
}
