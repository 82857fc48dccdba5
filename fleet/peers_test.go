package fleet

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePeerPending(t *testing.T) {
	for _, tc := range []struct {
		name string
		page string
		want map[string]map[string]int
	}{
		{"empty page", "", map[string]map[string]int{}},
		{"two models", `# TYPE exa_gateway_pending_prefill_blocks gauge
exa_gateway_pending_prefill_blocks{model="m1",replica="r0"} 12
exa_gateway_pending_prefill_blocks{model="m1",replica="r1"} 0
exa_gateway_pending_prefill_blocks{model="m2",replica="r0"} 3
exa_gateway_peer_prefill_blocks{model="m1",replica="r0"} 99
vllm:num_requests_waiting 4
`, map[string]map[string]int{"m1": {"r0": 12, "r1": 0}, "m2": {"r0": 3}}},
		{"missing label skipped", "exa_gateway_pending_prefill_blocks{model=\"m1\"} 5\nexa_gateway_pending_prefill_blocks{model=\"m1\",replica=\"r\"} 1\n",
			map[string]map[string]int{"m1": {"r": 1}}},
		{"absurd values clamped", "exa_gateway_pending_prefill_blocks{model=\"m\",replica=\"a\"} -4\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"b\"} 1e300\n" +
			"exa_gateway_pending_prefill_blocks{model=\"m\",replica=\"c\"} NaN\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"d\"} 2.6\n",
			map[string]map[string]int{"m": {"a": 0, "b": MaxLoadCount, "c": 0, "d": 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePeerPending(strings.NewReader(tc.page))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := parsePeerPending(strings.NewReader("exa_gateway_pending_prefill_blocks{model=\"m\" 5\n"))
	assert.Error(t, err)
}

// FuzzParsePeerPending: a peer's /metrics page is untrusted bytes; the
// parser never panics, and every count it returns is within 0..MaxLoadCount.
func FuzzParsePeerPending(f *testing.F) {
	f.Add("exa_gateway_pending_prefill_blocks{model=\"m1\",replica=\"r0\"} 12\n")
	f.Add("# TYPE exa_gateway_pending_prefill_blocks gauge\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 1e308\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 1e308\n")
	f.Add("exa_gateway_pending_prefill_blocks{model=\"\",replica=\"\"} -Inf\n")
	f.Add("# TYPE exa_gateway_pending_prefill_blocks histogram\nexa_gateway_pending_prefill_blocks_bucket{le=\"+Inf\"} 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		got, err := parsePeerPending(strings.NewReader(page))
		if err != nil {
			return
		}
		for m, reps := range got {
			for r, n := range reps {
				if n < 0 || n > MaxLoadCount {
					t.Fatalf("%s/%s: %d outside 0..%d", m, r, n, MaxLoadCount)
				}
			}
		}
	})
}
