package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMergeObjectives: --objective's priority wins over the cluster's for
// a name in both; the others are kept from each side.
func TestMergeObjectives(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cluster, flags map[string]int
		want           map[string]int
	}{
		{"none", nil, nil, map[string]int{}},
		{"cluster only", map[string]int{"chat": 10}, nil, map[string]int{"chat": 10}},
		{"flags only", nil, map[string]int{"batch": -1}, map[string]int{"batch": -1}},
		{"flag wins", map[string]int{"chat": 10, "batch": 5}, map[string]int{"batch": -1}, map[string]int{"chat": 10, "batch": -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, mergeObjectives(tc.cluster, tc.flags))
		})
	}
}

// TestWatchObjectivesOff: without --flow-control or --pool-name nothing
// is watched (no API server is reached) and set is never called.
func TestWatchObjectivesOff(t *testing.T) {
	set := func(map[string]int) { t.Error("set called") }
	for _, tc := range []struct {
		on   bool
		pool string
	}{{false, "pool"}, {true, ""}} {
		d := discoveryFlags{poolName: tc.pool, kubeconfig: "/nonexistent"}
		stop, err := d.watchObjectives(flowFlags{on: tc.on}, set, nil)
		require.NoError(t, err)
		stop()
	}
}
