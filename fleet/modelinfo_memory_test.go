package fleet

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestModelInfoMemory measures what one engine's model list can make the
// fleet hold at its bounds: a body of at most maxModelsBytes (4 MiB) with
// maxServedModels (16,384) entries, their names as long as the body allows,
// parsed as DiscoverModelInfo parses it. Run:
//
//	EXA_MEASURE=1 go test ./fleet -run TestModelInfoMemory -v
func TestModelInfoMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	// Each entry gets an equal share of the body: id and root of about
	// the same length.
	per := maxModelsBytes/maxServedModels - len(`{"id":"","root":"","max_model_len":131072},`) - 16
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	for i := range maxServedModels {
		if i > 0 {
			b.WriteByte(',')
		}
		id := fmt.Sprintf("%08d", i) + strings.Repeat("m", per/2-8)
		fmt.Fprintf(&b, `{"id":%q,"root":%q,"max_model_len":131072}`, id, strings.Repeat("r", per/2))
	}
	b.WriteString(`]}`)
	body := []byte(b.String())
	if len(body) > maxModelsBytes {
		t.Fatalf("body %d bytes, over the %d read", len(body), maxModelsBytes)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	m, err := parseModelInfo(body)
	after := heap()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d models from a %.2f MiB body: heap +%.2f MiB held", len(m), float64(len(body))/(1<<20), float64(after-before)/(1<<20))
	runtime.KeepAlive(m)
	runtime.KeepAlive(body)
}
