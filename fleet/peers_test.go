package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/examlops/gateway/config"

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
			got, _, err := parsePeerPending(strings.NewReader(tc.page), nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, _, err := parsePeerPending(strings.NewReader("exa_gateway_pending_prefill_blocks{model=\"m\" 5\n"), nil)
	assert.Error(t, err)
}

// FuzzParsePeerPending: a peer's /metrics page is untrusted bytes; the
// parser never panics, and every count it returns is within 0..MaxLoadCount.
func FuzzParsePeerPending(f *testing.F) {
	f.Add("exa_gateway_pending_prefill_blocks{model=\"m1\",replica=\"r0\"} 12\n")
	f.Add("exa_gateway_instance_info{id=\"abc\"} 1\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 2\n")
	f.Add("# TYPE exa_gateway_pending_prefill_blocks gauge\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 1e308\nexa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 1e308\n")
	f.Add("exa_gateway_pending_prefill_blocks{model=\"\",replica=\"\"} -Inf\n")
	f.Add("# TYPE exa_gateway_pending_prefill_blocks histogram\nexa_gateway_pending_prefill_blocks_bucket{le=\"+Inf\"} 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		got, id, err := parsePeerPending(strings.NewReader(page), nil)
		if err != nil {
			return
		}
		if id != "" && !strings.Contains(page, MetricInstance) {
			t.Fatalf("id %q from a page without %s", id, MetricInstance)
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

// resolverFunc is a Resolver from a function.
type resolverFunc func(ctx context.Context, host string) ([]string, error)

func (f resolverFunc) LookupHost(ctx context.Context, host string) ([]string, error) {
	return f(ctx, host)
}

// A dns+ entry's addresses become base URLs: each address at the entry's
// port (IPv6 in brackets) with its path, sorted, each once, at most
// config.MaxPeers; answers that are not addresses are skipped; no
// address is an error.
func TestLookupPeers(t *testing.T) {
	many := make([]string, config.MaxPeers+6)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)
	}
	answers := map[string][]string{
		"gw":    {"10.0.0.2", "fd00::1", "10.0.0.2", "not-an-ip", "10.0.0.1"},
		"many":  many,
		"names": {"gw-0.example"},
	}
	s, err := New(Options{Logger: quietLogger(), InstanceID: "me", Resolver: resolverFunc(func(_ context.Context, host string) ([]string, error) {
		if a, ok := answers[host]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("no such host %q", host)
	})})
	require.NoError(t, err)
	got, err := s.lookupPeers(context.Background(), "dns+http://gw:8080/exa/")
	require.NoError(t, err)
	assert.Equal(t, []string{"http://10.0.0.1:8080/exa", "http://10.0.0.2:8080/exa", "http://[fd00::1]:8080/exa"}, got)
	got, err = s.lookupPeers(context.Background(), "dns+http://gw")
	require.NoError(t, err)
	assert.Equal(t, []string{"http://10.0.0.1", "http://10.0.0.2", "http://[fd00::1]"}, got)
	got, err = s.lookupPeers(context.Background(), "dns+http://many:1")
	require.NoError(t, err)
	assert.Len(t, got, config.MaxPeers)
	_, err = s.lookupPeers(context.Background(), "dns+http://names:1")
	assert.ErrorContains(t, err, `no address for "names"`)
	_, err = s.lookupPeers(context.Background(), "dns+http://gone:1")
	assert.ErrorContains(t, err, `no such host "gone"`)
	assert.Equal(t, "me", s.Options().InstanceID)
	s2, err := New(Options{Logger: quietLogger()})
	require.NoError(t, err)
	assert.Len(t, s2.Options().InstanceID, 32, "16 random bytes in hex")
	assert.NotEqual(t, s2.Options().InstanceID, s.Options().InstanceID)
}

// The instance id is read from the first instance series.
func TestParsePeerInstance(t *testing.T) {
	_, id, err := parsePeerPending(strings.NewReader("exa_gateway_instance_info{id=\"abc\"} 1\nexa_gateway_instance_info{id=\"def\"} 1\n"), nil)
	require.NoError(t, err)
	assert.Equal(t, "abc", id)
	_, id, err = parsePeerPending(strings.NewReader("exa_gateway_pending_prefill_blocks{model=\"m\",replica=\"r\"} 1\n"), nil)
	require.NoError(t, err)
	assert.Empty(t, id)
}
