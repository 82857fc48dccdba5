package httpgw

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
)

// TestResponsesConversation: a Responses API conversation, streamed or
// not, continues on the replica that stored its previous response, on
// whichever replica its key alone would go to; an unknown
// previous_response_id is routed by key (and the engine's 404 relayed).
func TestResponsesConversation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := newFixture(t, 4, gateway.ModeCacheAware, enginetest.Options{})
			prev := ""
			var first string
			for turn := range 6 {
				body := map[string]any{"model": testModel, "input": fmt.Sprintf("turn %d of a long conversation", turn), "stream": stream}
				if turn == 0 {
					body["instructions"] = "You are terse."
				}
				if prev != "" {
					body["previous_response_id"] = prev
				}
				b, _ := json.Marshal(body)
				resp := f.post("/v1/responses", string(b))
				out := readAll(t, resp)
				require.Equal(t, http.StatusOK, resp.StatusCode, "turn %d: %s", turn, out)
				replica := resp.Header.Get(HeaderReplica)
				if turn == 0 {
					first = replica
				} else {
					require.Equal(t, first, replica, "turn %d continues on the replica holding its conversation", turn)
				}
				prev = front.ResponseID(out)
				require.True(t, strings.HasPrefix(prev, "resp_"+replica), "turn %d: id %q from %s", turn, prev, replica)
			}
			// Load elsewhere would not move a continuation either.
			resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"and now?","previous_response_id":"resp_unknown_1"}`)
			readAll(t, resp)
			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "an unknown id is routed by key; the engine answers 404")
		})
	}
}
