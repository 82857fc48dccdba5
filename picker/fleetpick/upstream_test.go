package fleetpick

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pending returns the pending prefill at each replica of testModel, by
// name.
func (f *pickFixture) pending() map[string]int {
	return fronttest.PendingPrefill(f.srv.Snapshot().Models[testModel].Gateway)
}

// A non-streamed request through the picker (behind pickertest.Envoy) is
// streamed from the engine: the engine is asked for a stream with usage,
// the request's pending prefill is released at the first chunk while the
// answer is still being generated (the engine holds it at its gate), and
// the client gets the non-streamed JSON answer, as from the HTTP gateway
// (httpgw's TestUpstreamStreamFirstToken). With DisableUpstreamStream the
// engine gets the body as sent and answers whole.
func TestPickerUpstreamStreamFirstToken(t *testing.T) {
	long := strings.Repeat("a long uncached prompt ", 40)
	for _, kind := range []string{"chat", "completions"} {
		t.Run(kind, func(t *testing.T) {
			f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{Chunks: 3}, pickSetup{})
			release := f.engines[0].Gate()
			path, body := "/v1/chat/completions", chatBody(testModel, false, "sys", long)
			if kind == "completions" {
				path, body = "/v1/completions", `{"model":"`+testModel+`","prompt":"`+long+`"}`
			}
			t.Cleanup(func() { release() })
			type answer struct {
				resp *http.Response
				body []byte
			}
			done := make(chan answer, 1)
			go func() {
				resp := f.post(path, body)
				done <- answer{resp, readAll(t, resp)} // the headers come at once, the body when assembled
			}()
			select {
			case <-f.engines[0].Gated(): // the first chunk is sent, the rest held
			case <-time.After(10 * time.Second):
				t.Fatal("the engine was not asked for a stream")
			}
			_, sent := f.engines[0].LastRequest()
			assert.Contains(t, string(sent), keys.StreamMembers, "the engine is asked to stream")
			require.Eventually(t, func() bool { return f.pending()["e0"] == 0 }, 10*time.Second, time.Millisecond,
				"pending prefill released at the first chunk")
			select {
			case <-done:
				t.Fatal("the answer came before the engine finished")
			default:
			}
			release()
			a := <-done
			fronttest.AssembledAnswer(t, kind, a.resp, a.body)
			f.waitIdle()
			assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "200"}))
		})
	}
	t.Run("off", func(t *testing.T) {
		f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{noUpstream: true})
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", long))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(b), `"content":"ok"`, "the engine's own non-streamed answer")
		_, sent := f.engines[0].LastRequest()
		assert.NotContains(t, string(sent), `"stream":true`)
	})
}

// The same non-streamed requests through the HTTP gateway and through the
// picker get the same answer, byte for byte: both assemble it from the
// engine's stream with the same aggregator. Streamed requests, and those
// the gateway does not stream from the engine (n > 1, max_tokens 1), are
// alike too.
func TestFrontsAssembleAlike(t *testing.T) {
	gw := newGatewayFixture(t, 1)
	pk := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody(testModel, false, "sys", "hello there")},
		{"/v1/completions", `{"model":"m1","prompt":"once upon a time"}`},
		{"/v1/chat/completions", chatBody(testModel, true, "sys", "streamed")},
		{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"two"}],"n":2}`},
		{"/v1/completions", `{"model":"m1","prompt":"one","max_tokens":1}`},
	} {
		rg := gw.post(tc.path, tc.body)
		bg := readAll(t, rg)
		rp := pk.post(tc.path, tc.body)
		bp := readAll(t, rp)
		require.Equal(t, http.StatusOK, rg.StatusCode, "%s", bg)
		require.Equal(t, http.StatusOK, rp.StatusCode, "%s", bp)
		assert.Equal(t, string(bg), string(bp), tc.body)
		assert.Equal(t, rg.Header.Get("Content-Type"), rp.Header.Get("Content-Type"), tc.body)
	}
}
