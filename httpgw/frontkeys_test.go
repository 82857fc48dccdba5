package httpgw

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// frontBodies are requests as users send them, each to its path: plain
// text, content as parts, several system messages, tools, images, a
// completions prompt, and Responses API input.
var frontBodies = []struct {
	path, body, session string
}{
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}`, ""},
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"system","content":"You are terse."},{"role":"system","content":"Answer in French."},{"role":"user","content":"hi"}]}`, "s1"},
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"developer","content":[{"type":"text","text":"You are terse."}]},{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, ""},
	{"/v1/chat/completions", `{"model":"m1","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"call f"},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"tool","content":"{\"ok\":true}"}]}`, "s1"},
	{"/v1/chat/completions", `{"model":"m1","user":"u7","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}]}`, ""},
	{"/v1/completions", `{"model":"m1","prompt":["You are terse.","hi"]}`, ""},
	{"/v1/completions", `{"model":"m1","prompt":[1,2,3,4]}`, ""},
	{"/v1/responses", `{"model":"m1","instructions":"You are terse.","input":"hi"}`, ""},
	{"/v1/responses", `{"model":"m1","instructions":"You are terse.","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","name":"f","arguments":"{}"}]}`, "s2"},
	{"/v1/responses", `{"model":"m1","input":"hi","previous_response_id":"resp_1"}`, ""},
}

// TestFrontsKeyAlike: the HTTP gateway's key (the function its proxy and
// its picker call) and the endpoint picker's own key function
// (picker.BodyKey) are equal on every body, and two gateways fed each
// front's keys make the same decisions.
func TestFrontsKeyAlike(t *testing.T) {
	h, err := keys.NewHasher(keys.TextBlockBytes)
	require.NoError(t, err)
	bodyKey, err := picker.BodyKey(keys.TextBlockBytes, "m1")
	require.NoError(t, err)
	newGW := func() *gateway.Gateway {
		g, err := gateway.New([]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}}, gateway.WithMode(gateway.ModeCacheAware))
		require.NoError(t, err)
		return g
	}
	viaGateway, viaPicker := newGW(), newGW()
	endpoints := map[string]endpointKind{"/v1/chat/completions": endpointChat, "/v1/completions": endpointCompletions, "/v1/responses": endpointResponses}
	for round := range 3 {
		for i, b := range frontBodies {
			name := fmt.Sprintf("round %d body %d (%s)", round, i, b.path)
			hdr := http.Header{}
			var phdr picker.Headers
			if b.session != "" {
				hdr.Set(HeaderSessionID, b.session)
				phdr = picker.Headers{{Name: "x-session-id", Value: b.session}}
			}
			req, err := parseRequest(endpoints[b.path], []byte(b.body))
			require.NoError(t, err, name)
			kg := appendKey(h, nil, req, hdr)
			kp, err := bodyKey(nil, &picker.PickRequest{Method: http.MethodPost, Path: b.path, Header: phdr, Body: []byte(b.body)})
			require.NoError(t, err, name)
			require.Equal(t, kg, kp, name)

			dg, err := viaGateway.Route(kg)
			require.NoError(t, err)
			dp, err := viaPicker.Route(kp)
			require.NoError(t, err)
			require.Equal(t, [4]any{dg.Replica, dg.Kind, dg.Matched, dg.Blocks}, [4]any{dp.Replica, dp.Kind, dp.Matched, dp.Blocks}, name)
			dg.Done(gateway.DoneInfo{})
			dp.Done(gateway.DoneInfo{})
		}
	}
}

// TestFrontsDecideAlike: the same requests, one at a time, through the
// HTTP gateway and through the endpoint picker behind Envoy (played by
// pickertest.Envoy) over fresh servers of the same configuration: each
// front answers with the same replica and the same decision text
// (X-Exa-Replica, X-Exa-Decision), so the two can be compared from
// outside.
func TestFrontsDecideAlike(t *testing.T) {
	gw := newFixture(t, 4, gateway.ModeCacheAware, enginetest.Options{})
	pk := newPickFixture(t, 4, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for round := range 3 {
		for i, b := range frontBodies {
			if b.path == "/v1/responses" {
				continue // the picker routes chat and completions
			}
			name := fmt.Sprintf("round %d body %d", round, i)
			var hdr []string
			if b.session != "" {
				hdr = []string{HeaderSessionID, b.session}
			}
			rg := gw.post(b.path, b.body, hdr...)
			readAll(t, rg)
			gw.settle() // the request is done: its load released
			rp := pk.post(b.path, b.body, hdr...)
			readAll(t, rp)
			pk.waitIdle()
			require.Equal(t, http.StatusOK, rg.StatusCode, name)
			require.Equal(t, http.StatusOK, rp.StatusCode, name)
			require.NotEmpty(t, rp.Header.Get(HeaderDecision), name)
			require.Equal(t, rg.Header.Get(HeaderReplica), rp.Header.Get(HeaderReplica), name)
			require.Equal(t, rg.Header.Get(HeaderDecision), rp.Header.Get(HeaderDecision), name)
		}
	}
}
