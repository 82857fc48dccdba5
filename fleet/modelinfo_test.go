package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
