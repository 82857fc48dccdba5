package httpgw

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// /v1/models entries carry vLLM's root, parent (null for a model) and,
// once the engines' own /v1/models were read, their max_model_len.
func TestModelsEntries(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	get := func() []map[string]any {
		resp, err := http.Get(f.http.URL + "/v1/models")
		require.NoError(t, err)
		var list struct{ Data []map[string]any }
		require.NoError(t, json.Unmarshal(readAll(t, resp), &list))
		return list.Data
	}
	d := get()
	require.Len(t, d, 1)
	assert.Equal(t, "m1", d[0]["root"])
	assert.Contains(t, d[0], "parent")
	assert.Nil(t, d[0]["parent"])
	assert.NotContains(t, d[0], "max_model_len", "unknown before the engines are asked")

	f.srv.DiscoverModelInfo(context.Background())
	d = get()
	assert.Equal(t, "/models/m1", d[0]["root"])
	assert.Equal(t, float64(enginetest.MaxModelLen), d[0]["max_model_len"])
}
