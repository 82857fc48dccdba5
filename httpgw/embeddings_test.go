package httpgw

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// TestEmbeddingsInputs (issue 30): /v1/embeddings takes every standard
// input (a string, strings, token ids, arrays of token ids), forwarded as
// it is; another input gets 400 naming the element (param).
func TestEmbeddingsInputs(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	for _, in := range []string{`"a"`, `["a","b"]`, `[1,2,3]`, `[[1,2],[3]]`} {
		body := `{"model":"m1","input":` + in + `}`
		resp := f.post("/v1/embeddings", body)
		out := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", in, out)
		_, b0 := f.engines[0].LastRequest()
		_, b1 := f.engines[1].LastRequest()
		assert.True(t, string(b0) == body || string(b1) == body, "%s forwarded as it is", in)
	}
	for in, param := range map[string]string{`["a",1]`: "input[1]", `[[1],["x"]]`: "input[1][0]", `{"a":1}`: "input"} {
		resp := f.post("/v1/embeddings", `{"model":"m1","input":`+in+`}`)
		var e errorBody
		require.NoError(t, json.Unmarshal(readAll(t, resp), &e))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, in)
		require.NotNil(t, e.Error.Param, in)
		assert.Equal(t, param, *e.Error.Param, in)
		assert.Contains(t, e.Error.Message, param, in)
	}
}
