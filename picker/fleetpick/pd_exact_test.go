package fleetpick

import (
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/picker/pickertest"
	"github.com/stretchr/testify/require"
)

// The picker (sidecar mode) routes a disaggregated model on the exact
// index as the HTTP gateway does: the prefill replica whose engine's
// events say it holds the prompt goes to the sidecar, and a prompt the
// decode engine holds is not split.
func TestPickerPDExactIndex(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{fleet: func(o *fleet.Options) { o.Tokenizer = &fronttest.WordTokenizer{} }})
	bind := fronttest.FreeTCP(t)
	nine := 9 // tokens: two blocks of 4 are below it, four are not
	model := config.Model{Disaggregate: true, PDMode: config.PDModeSidecar, PDMinUncachedTokens: &nine,
		Index: config.IndexExact, BlockSize: 4, KVEventsBind: bind,
		PrefillPool: "prefill", DecodePool: "decode", Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://prefill-0.example:8000"}, {Name: "p1", Address: "http://prefill-1.example:8000"}},
			"decode":  {{Name: "d0", Address: f.engines[0].URL()}},
		}}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	sys, user := fronttest.Words("sys", 8), fronttest.Words("ask", 8)
	store := func(pod string, seq uint64, text string) {
		tokens := fronttest.WordTokens(text)
		hashes := make([]uint64, len(tokens)/4)
		for i := range hashes {
			hashes[i] = seq*100 + uint64(i)
		}
		f.srv.HandleKVFrames(bind, fronttest.EventFrames(t, "kv@"+pod+"@"+testModel, seq, fronttest.StoredEvent(hashes, nil, tokens[:4*len(hashes)], 4)))
	}
	store("prefill-1.example:8000", 1, " "+sys)
	pick := func(user string) (string, bool) {
		x, err := f.client.Open(t.Context())
		require.NoError(t, err)
		r, err := x.Request(pickertest.Request{Body: []byte(chatBody(testModel, false, sys, user))})
		require.NoError(t, err)
		require.Equal(t, f.endpoint(0), r.Endpoint)
		hp, ok := r.Header("x-prefiller-host-port")
		_, err = x.Respond(200, "application/json", []byte(`{}`))
		require.NoError(t, err)
		require.NoError(t, x.Close())
		return hp, ok
	}
	hp, split := pick(user)
	require.True(t, split, "16 tokens not on the decode engine")
	require.Equal(t, "prefill-1.example:8000", hp, "the prefill engine holding the system prompt")
	store(strings.TrimPrefix(f.engines[0].URL(), "http://"), 1, " "+sys+" "+user)
	_, split = pick(user)
	require.False(t, split, "the decode engine holds the whole prompt")
	_, split = pick(fronttest.Words("new", 8))
	require.False(t, split, "8 tokens (2 blocks of 4) not on the decode engine: below 9")
	f.waitIdle()
	st := f.srv.Stats().Models[testModel].Disaggregation
	require.Equal(t, uint64(3), st.Decided)
	require.Equal(t, uint64(1), st.Split)
}
