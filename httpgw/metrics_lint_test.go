package httpgw

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
)

// exposition returns the gateway's /metrics page after traffic that
// brings out its series: answered, streamed, refused and unknown
// requests, /v1/models, a scrape, and the exact index's global counters.
func exposition(t *testing.T) []byte {
	t.Helper()
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	for _, stream := range []bool{false, true} {
		readAll(t, f.post("/v1/chat/completions", chatBody(testModel, stream, "sys", "hi")))
	}
	readAll(t, f.post("/v1/chat/completions", chatBody("nope", false, "sys", "hi")))
	readAll(t, f.post("/v1/unknown", "{}"))
	resp, err := http.Get(f.http.URL + "/v1/models")
	require.NoError(t, err)
	readAll(t, resp)
	f.srv.ScrapeAll(context.Background())
	f.settle()
	resp, err = http.Get(f.http.URL + "/metrics")
	require.NoError(t, err)
	return readAll(t, resp)
}

// The /metrics exposition passes the Prometheus linter (promlint, which
// `promtool check metrics` runs): counters end in _total, units are base
// units, no ratio gauge is left (ratios are PromQL over counters; see
// docs/metrics.md), and latency histograms reach an hour.
func TestMetricsLint(t *testing.T) {
	page := exposition(t)
	problems, err := promlint.New(bytes.NewReader(page)).Lint()
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	text := string(page)
	for _, gone := range []string{"prefix_hit_rate", "split_share"} {
		assert.NotContains(t, text, gone)
	}
	assert.Contains(t, text, `exa_gateway_request_duration_seconds_bucket{endpoint="chat",model="m1",le="3600"}`)
	assert.Contains(t, text, `exa_gateway_requests_total{code="404",endpoint="other",model="",reason=""} 1`)
}

// With promtool on PATH (CI installs Debian's prometheus package), the
// exposition also passes `promtool check metrics`.
func TestMetricsPromtool(t *testing.T) {
	tool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("EXA_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not on PATH and EXA_REQUIRE_PROMTOOL is set")
		}
		t.Skip("promtool not on PATH")
	}
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition(t))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics: %s", strings.TrimSpace(string(out)))
}

// outcomeLabels keeps code an HTTP status and moves the outcome words to
// reason.
func TestOutcomeLabels(t *testing.T) {
	for code, want := range map[string][2]string{
		"200": {"200", ""}, "404": {"404", ""}, "503": {"503", ""},
		front.CodeClientCanceled: {"499", front.CodeClientCanceled},
		front.CodeStreamError:    {"200", front.CodeStreamError},
		front.CodeAborted:        {"200", front.CodeAborted},
		front.CodeStreamEnded:    {"200", front.CodeStreamEnded},
		front.CodeShed429:        {"429", front.CodeShed},
		front.CodeSLO429:         {"429", front.CodeSLOUnattainable},
		"":                       {"", ""},
		"2000":                   {"", "2000"},
	} {
		s, r := front.OutcomeLabels(code)
		assert.Equal(t, want, [2]string{s, r}, code)
	}
}
