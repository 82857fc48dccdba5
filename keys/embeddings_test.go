package keys

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeEmbeddings: every standard embeddings input is accepted (a
// string, an array of strings, of token ids, of arrays of token ids);
// anything else is an error naming the element, as the field. Decode
// (a responses body) still wants objects in an "input" array.
func TestDecodeEmbeddings(t *testing.T) {
	for _, tc := range []struct{ body, field, msg string }{
		{`{"model":"m","input":"a sentence"}`, "", ""},
		{`{"model":"m","input":["a","b"]}`, "", ""},
		{`{"model":"m","input":[1,2,3]}`, "", ""},
		{`{"model":"m","input":[[1,2],[3]]}`, "", ""},
		{`{"model":"m","input":[]}`, "", ""},
		{`{"input":["a"]}`, "", ""},
		{`{"model":"m","input":null}`, "", ""},
		{`{"model":"m","input":["a",1]}`, "input[1]", "input[1] must be a string as input[0] is, not 1"},
		{`{"model":"m","input":[1,[2]]}`, "input[1]", "input[1] must be an integer (a token id) as input[0] is, not [2]"},
		{`{"model":"m","input":[[1],[2,"x"]]}`, "input[1][1]", "input[1][1] must be an integer (a token id), not \"x\""},
		{`{"model":"m","input":[1.5]}`, "input[0]", "input[0] must be an integer (a token id), not 1.5"},
		{`{"model":"m","input":[{"a":1}]}`, "input[0]", "input[0] must be a string, a token id or an array of token ids, not {\"a\":1}"},
		{`{"model":"m","input":5}`, "input", "input must be a string, an array of strings, an array of token ids or an array of arrays of token ids, not 5"},
		{`{"model":"m","input":5,"input":"ok"}`, "", ""},
	} {
		req, err := DecodeEmbeddings([]byte(tc.body))
		if tc.field == "" {
			require.NoError(t, err, tc.body)
			require.NotNil(t, req)
			continue
		}
		var fe *FieldError
		require.True(t, errors.As(err, &fe), "%s: %v", tc.body, err)
		require.Equal(t, tc.field, fe.Field, tc.body)
		require.Equal(t, tc.msg, fe.Msg, tc.body)
	}
	_, err := Decode([]byte(`{"model":"m","input":["a","b"]}`))
	var fe *FieldError
	require.True(t, errors.As(err, &fe))
	require.Equal(t, "input[0]", fe.Field, "a responses input array holds items")
}
