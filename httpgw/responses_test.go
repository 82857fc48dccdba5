package httpgw

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
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
				prev = responseID(out)
				require.True(t, strings.HasPrefix(prev, "resp_"+replica), "turn %d: id %q from %s", turn, prev, replica)
			}
			// Load elsewhere would not move a continuation either.
			resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"and now?","previous_response_id":"resp_unknown_1"}`)
			readAll(t, resp)
			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "an unknown id is routed by key; the engine answers 404")
		})
	}
}

// TestResponseID: the id is the first "id" whose string value starts with
// "resp", in an answer or an event stream, whitespace allowed.
func TestResponseID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"resp_1","object":"response"}`:                                                           "resp_1",
		`{"object":"response", "id" : "resp_2"}`:                                                        "resp_2",
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_3\"": "resp_3",
		`{"output":[{"id":"msg_1"}],"id":"resp_4"}`:                                                     "resp_4",
		`{"id":"resp_\"5"}`: "",
		`{"id":"resp_6`:     "",
		`{"id":7}`:          "",
		``:                  "",
	} {
		assert.Equal(t, want, responseID([]byte(in)), "%q", in)
	}
}

// TestResponseIDsBound: the store keeps the most recent maxResponseIDs
// ids and forgets the oldest first.
func TestResponseIDsBound(t *testing.T) {
	var r responseIDs
	for i := range maxResponseIDs + 10 {
		r.add(fmt.Sprintf("resp_%d", i), "m", "r0")
	}
	require.Len(t, r.m, maxResponseIDs)
	_, ok := r.owner("resp_9", "m")
	require.False(t, ok, "the oldest ids are forgotten")
	got, ok := r.owner(fmt.Sprintf("resp_%d", maxResponseIDs+9), "m")
	require.True(t, ok)
	require.Equal(t, "r0", got)
	_, ok = r.owner(fmt.Sprintf("resp_%d", maxResponseIDs+9), "other")
	require.False(t, ok, "an id is its model's")
}

// FuzzResponseID: any answer head gives an id that occurs in it, starts
// with "resp" and holds no quote or backslash, or none; never a panic.
func FuzzResponseID(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, "data: {\"response\":{\"id\" :\t\"resp_x\"}}", `{"id":"msg"},{"id":"resp"}`, `"id"`, `"id":`, `"id":"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		id := responseID(head)
		if id == "" {
			return
		}
		if !strings.HasPrefix(id, "resp") || strings.ContainsAny(id, "\"\\") || !strings.Contains(string(head), `"`+id+`"`) {
			t.Fatalf("responseID(%q) = %q", head, id)
		}
	})
}

// TestResponseIDsMemory measures the store at its bound (EXA_MEASURE=1):
// maxResponseIDs ids of vLLM's shape ("resp_" and 32 hex digits).
func TestResponseIDsMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var r responseIDs
	for i := range maxResponseIDs {
		r.add(fmt.Sprintf("resp_%032x", i), "meta-llama/Llama-3.1-8B-Instruct", fmt.Sprintf("r%d", i%8))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%d ids: %.1f MiB, %.0f bytes an id", maxResponseIDs, float64(after.HeapAlloc-before.HeapAlloc)/(1<<20),
		float64(after.HeapAlloc-before.HeapAlloc)/maxResponseIDs)
	runtime.KeepAlive(&r)
}
