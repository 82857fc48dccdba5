package sim

import (
	"fmt"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/reference"
)

// Policy is a routing policy to simulate: a built-in gateway Mode, or a
// custom gateway.Policy made by New.
type Policy struct {
	// Name labels the policy in the report; required and unique.
	Name string
	// Mode is the built-in policy used when New is nil; the zero value is
	// gateway.ModeRoundRobin. Run rejects a Mode that is not a built-in
	// mode with ErrInvalidConfig.
	Mode gateway.Mode
	// New, if set, makes a fresh policy for one run, seeded with
	// Config.Seed; it overrides Mode.
	New func(seed uint64) gateway.Policy
}

// DefaultPolicies returns the policies Run compares by default: the
// gateway's round_robin, load_aware and cache_aware modes, then the
// reference policies sglang, dynamo, chwbl, p2c and prefix_affinity.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: "round_robin", Mode: gateway.ModeRoundRobin},
		{Name: "load_aware", Mode: gateway.ModeLoadAware},
		{Name: "cache_aware", Mode: gateway.ModeCacheAware},
		{Name: "sglang", New: func(uint64) gateway.Policy { return &reference.SGLang{} }},
		{Name: "dynamo", New: func(uint64) gateway.Policy { return &reference.Dynamo{} }},
		{Name: "chwbl", New: func(uint64) gateway.Policy { return &reference.CHWBL{} }},
		{Name: "p2c", New: func(seed uint64) gateway.Policy { return reference.NewP2C(seed) }},
		{Name: "prefix_affinity", New: func(uint64) gateway.Policy { return &reference.PrefixAffinity{} }},
	}
}

// PolicyByName returns the default policy called name (hyphens accepted for
// underscores), or an error wrapping ErrInvalidConfig.
func PolicyByName(name string) (Policy, error) {
	n := strings.ReplaceAll(name, "-", "_")
	var names []string
	for _, p := range DefaultPolicies() {
		if p.Name == n {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Policy{}, fmt.Errorf("%w: policy %q unknown (have %s)", ErrInvalidConfig, name, strings.Join(names, ", "))
}
