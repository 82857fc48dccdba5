package httpgw

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A body nested deeper than jsonscan.MaxDepth is a bad request, not a
// stack overflow.
func TestRequestDeepNesting(t *testing.T) {
	in := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	_, err := parseRequest(endpointChat, []byte(`{"model":"m","x":`+in+`}`))
	assert.ErrorIs(t, err, ErrBadRequest)
}
