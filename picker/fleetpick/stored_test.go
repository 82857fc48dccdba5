package fleetpick

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// do sends one request through the picker with the method, path and body
// ("" for none) and returns the answer, the engine that served it (-1 if
// none) and the body.
func (f *pickFixture) do(method, path, body string) (*http.Response, int, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	if body == "" {
		req.Body = http.NoBody
	} else {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(f.t, err)
	f.waitIdle()
	return resp, f.engineOf(resp.Header.Get(pickertest.HeaderEndpoint)), string(b)
}

// TestPickerStoredResponses (issue 30): through the picker, GET and
// DELETE /v1/responses/{id}, POST .../cancel and GET .../input_items go
// to the engine that stored the response although round-robin would move
// each request; a deleted one is forgotten; an unknown id gets 404 naming
// it, as from the HTTP gateway, and reaches no engine.
func TestPickerStoredResponses(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
	status, home, id, out := f.respond("store this", "", false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	require.GreaterOrEqual(t, home, 0)
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodGet, "/v1/responses/" + id, `"status":"completed"`},
		{http.MethodGet, "/v1/responses/" + id + "?include=x", `"status":"completed"`},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", `"object":"list"`},
		{http.MethodPost, "/v1/responses/" + id + "/cancel", `"status":"cancelled"`},
		{http.MethodGet, "/v1/responses/" + id, `"id":"` + id + `"`},
		{http.MethodDelete, "/v1/responses/" + id, `"deleted":true`},
	} {
		resp, e, body := f.do(tc.method, tc.path, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		assert.Equal(t, home, e, "%s %s served by the engine that stored it", tc.method, tc.path)
		assert.Contains(t, body, tc.want, "%s %s", tc.method, tc.path)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code, inMsg  string
	}{
		{http.MethodGet, "/v1/responses/" + id, http.StatusNotFound, "response_not_found", `"` + id + `"`},
		{http.MethodDelete, "/v1/responses/resp_never", http.StatusNotFound, "response_not_found", `"resp_never"`},
		{http.MethodPut, "/v1/responses/resp_x", http.StatusMethodNotAllowed, "method_not_allowed", "GET, DELETE"},
		{http.MethodGet, "/v1/responses/resp_x/other", http.StatusNotFound, "unknown_endpoint", "/v1/responses/resp_x/other"},
	} {
		resp, e, body := f.do(tc.method, tc.path, "")
		assert.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		assert.Equal(t, -1, e, "answered by the picker")
		eb := decodeError(t, []byte(body))
		require.NotNil(t, eb.Code, body)
		assert.Equal(t, tc.code, *eb.Code, "%s %s", tc.method, tc.path)
		assert.Contains(t, eb.Message, tc.inMsg, "%s %s", tc.method, tc.path)
	}
	assert.Equal(t, 6.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "responses", "code": "200"})-1)
	assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "responses", "code": "404"}))
}

// TestPickerEmbeddings (issue 30): /v1/embeddings (every standard input
// form), /tokenize and /detokenize are routed by the picker, as the HTTP
// gateway routes them, by load alone (least loaded here), counted under
// their endpoint, no routing decision counted; a bad input gets 400
// naming the element.
func TestPickerEmbeddings(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	f.engines[0].SetLoad(9, 4, 0.8)
	f.engines[1].SetLoad(0, 0, 0.1)
	f.srv.ScrapeAll(t.Context())
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/embeddings", `{"model":"m1","input":"a"}`, `"embedding"`},
		{"/v1/embeddings", `{"model":"m1","input":["a","b"]}`, `"embedding"`},
		{"/v1/embeddings", `{"model":"m1","input":[1,2]}`, `"embedding"`},
		{"/v1/embeddings", `{"model":"m1","input":[[1,2],[3]]}`, `"embedding"`},
		{"/tokenize", `{"model":"m1","prompt":"a b c"}`, `"tokens":[0,1,2]`},
		{"/detokenize", `{"model":"m1","tokens":[3,4]}`, `"prompt":"w3 w4"`},
	} {
		resp, e, body := f.do(http.MethodPost, tc.path, tc.body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", tc.path, tc.body, body)
		assert.Equal(t, 1, e, "%s: the least loaded engine", tc.path)
		assert.Contains(t, body, tc.want)
		assert.Equal(t, "e1", resp.Header.Get("X-Exa-Replica"))
	}
	assert.Equal(t, 4.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "embeddings", "code": "200"}))
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "tokenize", "code": "200"}))
	assert.Equal(t, 0.0, f.counter("exa_gateway_routed_total", nil), "no routing decision counted")
	for body, param := range map[string]string{
		`{"model":"m1","input":["a",1]}`: "input[1]",
		`{"input":"a"}`:                  "model",
		`{"model":"nope","input":"a"}`:   "model",
	} {
		resp, e, out := f.do(http.MethodPost, "/v1/embeddings", body)
		assert.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, resp.StatusCode, "%s: %s", body, out)
		assert.Equal(t, -1, e)
		eb := decodeError(t, []byte(out))
		require.NotNil(t, eb.Param, out)
		assert.Equal(t, param, *eb.Param, body)
	}
}

// TestPickerLearnsIDFromHead: a response's id is remembered as soon as
// the head of its answer passes through the picker, before the request is
// done (the client may ask about it at once: the official Node client's
// responses.retrieve right after responses.create got 404 from the
// picker while its tracker was not yet done); a fallback that served
// corrects it at Done.
func TestPickerLearnsIDFromHead(t *testing.T) {
	fl := pickServer(t, gateway.ModeRoundRobin, "http://10.0.0.1:8000", "http://10.0.0.2:8000")
	r, err := New(fl, Options{Fallbacks: 1})
	require.NoError(t, err)
	for _, served := range []string{"", "other"} {
		pk, err := r.Pick(t.Context(), &picker.PickRequest{Method: http.MethodPost, Path: "/v1/responses", Body: []byte(`{"model":"m1","input":"hi"}`)})
		require.NoError(t, err)
		id := "resp_head_" + served
		ht := pk.Tracker.(picker.HeadTracker)
		require.True(t, ht.ResponseHead(http.StatusOK, []byte(`{"id":"`+id+`","object":"response"}`)))
		model, replica, ok := r.respIDs.Lookup(id)
		require.True(t, ok, "known before Done")
		require.Equal(t, testModel, model)
		picked := map[string]string{"10.0.0.1:8000": "r0", "10.0.0.2:8000": "r1"}[pk.Endpoint]
		require.Equal(t, picked, replica)
		o := picker.Outcome{Status: http.StatusOK}
		if served != "" {
			o.Served = pk.Fallbacks[0]
		}
		pk.Tracker.Done(o)
		_, replica, ok = r.respIDs.Lookup(id)
		require.True(t, ok)
		if served == "" {
			require.Equal(t, picked, replica)
		} else {
			require.Equal(t, map[string]string{"10.0.0.1:8000": "r0", "10.0.0.2:8000": "r1"}[pk.Fallbacks[0]], replica, "the fallback that served")
		}
	}
}

// TestClientOf: a request's client is Envoy's source.address attribute
// when it sends one, else the last address of its last X-Forwarded-For
// (Envoy's, appended last; spaces trimmed), any case of the name.
func TestClientOf(t *testing.T) {
	for _, tc := range []struct {
		h    picker.Headers
		src  string
		want string
	}{
		{picker.Headers{{Name: "x-forwarded-for", Value: "1.1.1.1, 10.0.0.7"}}, "", "10.0.0.7"},
		{picker.Headers{{Name: "X-Forwarded-For", Value: "1.1.1.1"}, {Name: "x-forwarded-for", Value: "10.0.0.8"}}, "", "10.0.0.8"},
		{picker.Headers{{Name: "x-session-id", Value: "s"}}, "", ""},
		{picker.Headers{{Name: "x-forwarded-for", Value: "10.0.0.7"}}, "192.0.2.4:5151", "192.0.2.4:5151"},
	} {
		assert.Equal(t, tc.want, clientOf(&picker.PickRequest{Header: tc.h, ClientAddress: tc.src}))
	}
}

// TestPickerShedPassThrough (issue 29, N5, at the picker): while every
// replica is past Admission's queue threshold, /v1/embeddings, /tokenize
// and /detokenize get 429 like inference requests, reach no engine and
// count as shed.
func TestPickerShedPassThrough(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{Admission: gateway.Admission{QueueDepth: 3}}})
	for _, e := range f.engines {
		e.SetLoad(5, 1, 0.2)
	}
	f.srv.ScrapeAll(t.Context())
	for path, body := range map[string]string{"/v1/embeddings": `{"model":"m1","input":"a"}`, "/tokenize": `{"model":"m1","prompt":"a"}`, "/detokenize": `{"model":"m1","tokens":[1]}`} {
		resp, e, out := f.do(http.MethodPost, path, body)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", path, out)
		assert.Equal(t, -1, e, path)
	}
	assert.Equal(t, 3.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "429", "reason": "shed"}))
	f.engines[1].SetLoad(0, 0, 0.1)
	f.srv.ScrapeAll(t.Context())
	resp, e, out := f.do(http.MethodPost, "/v1/embeddings", `{"model":"m1","input":"a"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, out)
	assert.Equal(t, 1, e)
}
