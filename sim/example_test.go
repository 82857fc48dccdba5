package sim_test

import (
	"fmt"
	"log"
	"os"

	"github.com/examlops/gateway/sim"
)

// Compare every default policy on the embedded default workload, 8
// replicas of the default preset, and print the table.
func ExampleRun() {
	rep, err := sim.Run(sim.Config{Seed: 1})
	if err != nil {
		log.Fatal(err)
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Replay a Mooncake trace twice as fast on 4 replicas of a 70B node and
// compare two policies.
func ExampleTraceFile() {
	w, err := sim.TraceFile("trace.jsonl", sim.TraceOptions{Speed: 2})
	if err != nil {
		log.Fatal(err)
	}
	var pols []sim.Policy
	for _, name := range []string{"cache_aware", "sglang"} {
		p, err := sim.PolicyByName(name)
		if err != nil {
			log.Fatal(err)
		}
		pols = append(pols, p)
	}
	rep, err := sim.Run(sim.Config{Workload: w, Preset: sim.MustPreset("70b-h100-tp8"), Replicas: 4, Policies: pols})
	if err != nil {
		log.Fatal(err)
	}
	ca, _ := rep.Result("cache_aware")
	fmt.Printf("cache_aware: %.1f%% of prompt tokens cached, mean TTFT %.3fs\n", 100*ca.TokenHitRate, ca.TTFT.Mean)
}
