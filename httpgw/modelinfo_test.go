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

func TestParseModelInfo(t *testing.T) {
	got, err := parseModelInfo([]byte(`{"object":"list","data":[
		{"id":"m","root":"/w/m","parent":null,"max_model_len":8192},
		{"id":"lora","root":"/a","parent":"m","max_model_len":8192},
		{"id":"x","max_model_len":1e30},
		{"id":"y","max_model_len":"big","root":7},
		{"id":""}]}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]engineModel{"m": {root: "/w/m", maxModelLen: 8192}, "x": {}, "y": {}}, got)
	for _, bad := range []string{``, `[]`, `{"data":[1]}`, `{"data":[]} x`} {
		_, err := parseModelInfo([]byte(bad))
		assert.ErrorIs(t, err, errModelList, bad)
	}
}

// FuzzParseModelInfo: any engine answer parses or fails with
// errModelList, never panics, and lengths stay in range.
func FuzzParseModelInfo(f *testing.F) {
	for _, s := range []string{`{"data":[{"id":"m","root":"/w","max_model_len":4096,"parent":null}]}`,
		`{"data":[{"id":"a","parent":"m"}]}`, `{"data":null}`, `{"data":[{"id":"m","max_model_len":-1}]}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parseModelInfo(body)
		if err != nil {
			require.ErrorIs(t, err, errModelList)
			return
		}
		for id, m := range got {
			if id == "" || m.maxModelLen < 0 || m.maxModelLen > maxModelLenLimit {
				t.Fatalf("entry %q: %+v", id, m)
			}
		}
	})
}
