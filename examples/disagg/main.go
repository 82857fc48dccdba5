// Command disagg shows that splitting prefill and decode across replicas is
// a scheduling concern only. It plans requests of a disaggregated model
// with the library's P/D plan (gateway.PD), then runs a small deterministic
// reference engine (one attention head, float32, internal/refengine) both
// ways: co-located, and split, with the prefill's KV cache serialised and
// handed to the decode side. The outputs are compared token for token. The
// HTTP gateway runs the same plan against real engines; its e2e tests
// compare their answers.
//
//	go run ./examples/disagg
package main

import (
	"fmt"
	"log"
	"os"
	"slices"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/refengine"
	"github.com/examlops/gateway/keys"
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// outputTokens is how many tokens each path generates.
const outputTokens = 16

func run(w *os.File) error {
	prefill, err := gateway.New([]gateway.Replica{{Name: "p0"}, {Name: "p1"}}, gateway.WithMode(gateway.ModeCacheAware))
	if err != nil {
		return err
	}
	decode, err := gateway.New([]gateway.Replica{{Name: "d0"}, {Name: "d1"}}, gateway.WithMode(gateway.ModeLoadAware))
	if err != nil {
		return err
	}
	pd := gateway.PD{Prefill: prefill, Decode: decode, MinUncached: 32}
	m := refengine.Default
	for _, system := range []string{"You are a helpful assistant.", "You are a Go reviewer. Point out bugs first, then style."} {
		key := keys.PrefixKey(system, "sess-1", "")
		plan, err := pd.Route(key, 16, gateway.Target{}, gateway.Target{})
		if err != nil {
			return err
		}
		prompt := refengine.PromptOf(key, m.Vocab)
		co := m.Colocated(prompt, outputTokens)
		sp, kvBytes, err := m.Split(prompt, outputTokens)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "split %v: prefill %s, decode %s; identical output: %v (%d tokens, %d-byte KV transfer)\n",
			plan.Split, plan.Prefill.Replica, plan.Decode.Replica, slices.Equal(co, sp), len(co), kvBytes)
		if !slices.Equal(co, sp) {
			return fmt.Errorf("split output %v differs from co-located %v", sp, co)
		}
		plan.Prefill.Done(gateway.DoneInfo{})
		plan.Decode.Done(gateway.DoneInfo{})
	}
	return nil
}
