package main

import (
	"os"
	"regexp"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeMainJob: the README's main job, `exa serve routing simulate`
// with no flags, prints exactly the block the README shows under it, so
// the figures a newcomer reads first are the ones the command gives.
//
// Only on amd64: elsewhere (arm64, ppc64le, s390x) the compiler may fuse
// a multiply and an add, which rounds once instead of twice and can move
// a tie in the simulator's floating point, and with it a figure.
func TestReadmeMainJob(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the main job under every policy (a few CPU seconds)")
	}
	if runtime.GOARCH != "amd64" {
		t.Skipf("the README's block is amd64's; %s may fuse multiply-adds", runtime.GOARCH)
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)go run \\./cmd/exa serve routing simulate\n.*?The first prints[^\n]*\n+```\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "README.md: no ``` block after \"The first prints\" under the main job's command")
	got := ok(t, newConfig(t), "serve", "routing", "simulate")
	require.Equal(t, string(m[1]), got, "README.md's main-job block differs from the command's output")
}
