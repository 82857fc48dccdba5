package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRewrite(t *testing.T) {
	drop := func(name string) bool { return name == "a" }
	for _, tc := range []struct{ in, tail, want string }{
		{`{"a":1,"b": 2.50 ,"a":[3]}`, `"c":true`, `{"b":2.50,"c":true}`},
		{` { "\u0061" : 1 , "b":{"a":1} } `, ``, `{"b":{"a":1}}`},
		{`{}`, `"c":1`, `{"c":1}`},
	} {
		got, err := Rewrite([]byte(tc.in), drop, tc.tail)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, string(got), tc.in)
	}
	for _, bad := range []string{``, `[]`, `{"a":1}x`, `{"a"}`} {
		_, err := Rewrite([]byte(bad), drop, "")
		assert.ErrorIs(t, err, ErrSyntax, "%q", bad)
	}
}
