package gateway

import (
	"fmt"
	"slices"
	"testing"

	"github.com/examlops/gateway/keys"
)

// BenchmarkRouteAdapter16 routes requests for 8 adapters over 16
// cache-aware replicas that report 4 slots each (two adapters running),
// with Done: the cost of the adapter state beside BenchmarkRouteBase16,
// the same requests routed for the base model in the same run. Both must
// report 0 allocs/op.
func BenchmarkRouteAdapter16(b *testing.B) {
	for _, tc := range []struct {
		name    string
		adapter bool
	}{{"base", false}, {"adapter", true}} {
		b.Run(tc.name, func(b *testing.B) {
			g := loraCluster(b, 16, 4)
			for i := range 16 {
				if err := g.UpdateAdapters(fmt.Sprintf("r%d", i), AdapterReport{Running: []string{fmt.Sprintf("a%d", i%8), fmt.Sprintf("a%d", (i+3)%8)}, MaxLoras: 4}); err != nil {
					b.Fatal(err)
				}
			}
			names := make([]string, 8)
			ks := make([]Key, 64)
			for i := range ks {
				names[i%8] = fmt.Sprintf("a%d", i%8)
				ks[i] = loraKey(i, 16, 8)
				if tc.adapter {
					ks[i] = keys.Salt(slices.Clone(ks[i]), names[i%8])
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				adapter := ""
				if tc.adapter {
					adapter = names[i%8]
				}
				d, err := g.RouteWith(ks[i%len(ks)], Target{Adapter: adapter})
				if err != nil {
					b.Fatal(err)
				}
				d.Done(DoneInfo{})
			}
		})
	}
}
