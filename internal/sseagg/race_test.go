//go:build race

package sseagg

// raceEnabled reports a build with the race detector, whose allocations
// the heap measurements do not describe.
const raceEnabled = true
