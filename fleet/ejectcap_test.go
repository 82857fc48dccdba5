package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The cap never lets more than the share out, keeps one engine in below
// 100%, and refuses only what would exceed the share.
func TestEjectionAllowedProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.IntRange(1, 64).Draw(t, "total")
		pct := rapid.IntRange(1, 100).Draw(t, "pct")
		ejected := make([]bool, total)
		n := 0
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			i := rapid.IntRange(0, total-1).Draw(t, "engine")
			if ejected[i] {
				if rapid.Bool().Draw(t, "readmit") {
					ejected[i] = false
					n--
				}
				continue
			}
			ok := EjectionAllowed(n, total, pct)
			if ok != ((n+1)*100 <= total*pct) {
				t.Fatalf("EjectionAllowed(%d, %d, %d) = %v: refuses what the share allows, or the reverse", n, total, pct, ok)
			}
			if ok {
				ejected[i] = true
				n++
			}
			if n*100 > total*pct {
				t.Fatalf("%d of %d ejected: more than %d%%", n, total, pct)
			}
			if pct < 100 && n == total {
				t.Fatalf("all %d ejected at %d%%", total, pct)
			}
		}
	})
}

// syncBuffer is a log sink the test reads while the fleet writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON log lines whose msg is msg.
func (s *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// With every engine's probe timing out at once (the gateway starved of
// CPU, or cut off), at most the configured share is ejected; the log
// lines and the metric say why, and the refusal is logged once an engine.
func TestProbeTimeoutsEjectAtMostTheShare(t *testing.T) {
	for _, tt := range []struct {
		pct, want int
	}{{0, 2}, {25, 1}, {10, 0}, {100, 4}} {
		t.Run(fmt.Sprintf("max %d%%", tt.pct), func(t *testing.T) {
			release := make(chan struct{})
			var reps []config.Replica
			for i := range 4 {
				srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					select { // never answers in time: every probe times out
					case <-release:
					case <-r.Context().Done():
					}
				}))
				reps = append(reps, config.Replica{Name: fmt.Sprintf("e%d", i), Address: srv.URL})
			}
			t.Cleanup(func() { close(release) })
			logs := &syncBuffer{}
			s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(logs, nil)),
				EjectAfter: 1, ProbeTimeout: 20 * time.Millisecond, MaxEjectionPercent: tt.pct})
			require.NoError(t, err)
			require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: reps}))
			for range 3 {
				s.ProbeAll(context.Background())
			}
			ejected := 0
			for _, ep := range s.Snapshot().Endpoints {
				if !ep.Health.Healthy() {
					ejected++
				}
			}
			assert.Equal(t, tt.want, ejected, "engines ejected of 4")
			ej := logs.lines(t, "gateway: engine ejected")
			require.Len(t, ej, tt.want)
			for _, l := range ej {
				assert.Equal(t, "probe", l["source"])
				assert.Equal(t, "timeout", l["reason"])
				assert.Contains(t, l["detail"], "/health\": ", "the error, naming the probe")
			}
			capped := logs.lines(t, "gateway: engine not ejected: at the ejection cap")
			require.Len(t, capped, 4-tt.want, "one line an engine kept in, not one a probe")
			for _, l := range capped {
				assert.Equal(t, "timeout", l["reason"])
				assert.EqualValues(t, 4, l["engines"])
			}
			assert.Equal(t, float64(tt.want), testutil.ToFloat64(s.metrics.ejections.WithLabelValues(reps[0].Address, "probe", "timeout"))+
				testutil.ToFloat64(s.metrics.ejections.WithLabelValues(reps[1].Address, "probe", "timeout"))+
				testutil.ToFloat64(s.metrics.ejections.WithLabelValues(reps[2].Address, "probe", "timeout"))+
				testutil.ToFloat64(s.metrics.ejections.WithLabelValues(reps[3].Address, "probe", "timeout")))
			assert.Equal(t, float64(3*(4-tt.want)), testutil.ToFloat64(s.metrics.ejectionsCapped.WithLabelValues("probe", "timeout")))
		})
	}
}

// A capped engine is ejected once another is readmitted; a traffic
// ejection names its reason.
func TestEjectionCapFreesOnReadmission(t *testing.T) {
	logs := &syncBuffer{}
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(logs, nil)), EjectAfter: 1, ReadmitAfter: 1, EjectionTime: -1})
	require.NoError(t, err)
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {
		{Name: "a", Address: "127.0.0.1:1"}, {Name: "b", Address: "127.0.0.1:2"}}}))
	a, b := s.Snapshot().Models[testModel].ByName["a"], s.Snapshot().Models[testModel].ByName["b"]
	s.Observe(a, a.Health.Failure(true))
	s.Observe(b, b.Health.Timeout())
	assert.False(t, a.Health.Healthy())
	assert.True(t, b.Health.Healthy(), "1 of 2 at 50%")
	s.Observe(a, a.Health.Success(true))
	require.True(t, a.Health.Healthy())
	s.Observe(b, b.Health.Timeout())
	assert.False(t, b.Health.Healthy(), "a readmitted: b may go")
	ej := logs.lines(t, "gateway: engine ejected")
	require.Len(t, ej, 2)
	assert.Equal(t, []any{"traffic", "refused"}, []any{ej[0]["source"], ej[0]["reason"]})
	assert.Equal(t, []any{"traffic", "timeout"}, []any{ej[1]["source"], ej[1]["reason"]})
}

func TestProbeCause(t *testing.T) {
	for _, tt := range []struct {
		err    error
		status int
		want   EjectReason
		detail string
	}{
		{nil, 503, ReasonStatus, "status 503"},
		{context.DeadlineExceeded, 0, ReasonTimeout, "context deadline exceeded"},
		{errors.New("reset"), 0, ReasonError, "reset"},
	} {
		c := probeCause(tt.err, tt.status)
		assert.Equal(t, Cause{SourceProbe, tt.want, tt.detail}, c)
	}
	// A refused connection, for real.
	_, c := probe(context.Background(), &http.Client{}, "http://127.0.0.1:1")
	assert.Equal(t, ReasonRefused, c.Reason, c.Detail)
	for _, r := range []EjectReason{ReasonError, ReasonTimeout, ReasonRefused, ReasonStatus} {
		assert.NotEmpty(t, r.String())
	}
	_, err := New(Options{MaxEjectionPercent: 101})
	assert.ErrorContains(t, err, "MaxEjectionPercent 101: want 1 to 100")
}
