package fronttest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// Series returns the series of the named metric in g whose labels include
// labels.
func Series(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []*dto.Metric {
	t.Helper()
	fams, err := g.Gather()
	require.NoError(t, err)
	var out []*dto.Metric
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			if matches(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == k && lp.GetValue() == v }) {
			return false
		}
	}
	return true
}

// Counter sums the values of the counter series of Series, 0 when none.
func Counter(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	total := 0.0
	for _, m := range Series(t, g, name, labels) {
		total += m.GetCounter().GetValue()
	}
	return total
}

// Gauge sums the values of the gauge series of Series, 0 when none.
func Gauge(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	total := 0.0
	for _, m := range Series(t, g, name, labels) {
		total += m.GetGauge().GetValue()
	}
	return total
}

// HistCount sums the sample counts of the histogram series of Series.
func HistCount(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	var total uint64
	for _, m := range Series(t, g, name, labels) {
		total += m.GetHistogram().GetSampleCount()
	}
	return total
}

// ChatBody is a chat completions request for model: the first message is
// the system's, then user and assistant in turn; max_tokens 4.
func ChatBody(model string, stream bool, msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		ms = append(ms, msg{role, m})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "stream": stream, "max_tokens": 4})
	return string(b)
}
