package httpgw

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
)

// do sends one request with the method and path (and body, if any).
func (f *fixture) do(method, path, body string) (*http.Response, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	if body == "" {
		req.Body = http.NoBody
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(f.t, err)
	return resp, string(b)
}

// TestStoredResponses (issue 30): GET and DELETE /v1/responses/{id},
// POST .../cancel and GET .../input_items go to the replica that stored
// the response although round-robin would move each request; a deleted
// response is forgotten; an unknown id gets 404 naming it; another
// method 405 with Allow, another path 404; the replica unhealthy, 503.
func TestStoredResponses(t *testing.T) {
	f := newFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{})
	resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"hello"}`)
	out := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	id, owner := front.ResponseID(out), resp.Header.Get(HeaderReplica)
	require.NotEmpty(t, id)
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodGet, "/v1/responses/" + id, `"status":"completed"`},
		{http.MethodGet, "/v1/responses/" + id + "?include=x", `"status":"completed"`},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", `"object":"list"`},
		{http.MethodPost, "/v1/responses/" + id + "/cancel", `"status":"cancelled"`},
		{http.MethodGet, "/v1/responses/" + id, `"id":"` + id + `"`},
		{http.MethodDelete, "/v1/responses/" + id, `"deleted":true`},
	} {
		resp, body := f.do(tc.method, tc.path, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		assert.Equal(t, owner, resp.Header.Get(HeaderReplica), "%s %s", tc.method, tc.path)
		assert.Equal(t, owner, resp.Header.Get("X-Engine"), "%s %s", tc.method, tc.path)
		assert.Contains(t, body, tc.want, "%s %s", tc.method, tc.path)
	}
	// Deleted: forgotten, the gateway answers itself.
	for _, tc := range []struct {
		method, path string
		status       int
		code, inMsg  string
	}{
		{http.MethodGet, "/v1/responses/" + id, http.StatusNotFound, "response_not_found", `"` + id + `"`},
		{http.MethodDelete, "/v1/responses/resp_never", http.StatusNotFound, "response_not_found", `"resp_never"`},
		{http.MethodPost, "/v1/responses/resp_never/cancel", http.StatusNotFound, "response_not_found", `"resp_never"`},
		{http.MethodPut, "/v1/responses/resp_x", http.StatusMethodNotAllowed, "method_not_allowed", "GET, DELETE"},
		{http.MethodGet, "/v1/responses/resp_x/cancel", http.StatusMethodNotAllowed, "method_not_allowed", "POST"},
		{http.MethodGet, "/v1/responses/resp_x/other", http.StatusNotFound, "unknown_endpoint", "/v1/responses/resp_x/other"},
		{http.MethodGet, "/v1/responses/", http.StatusNotFound, "unknown_endpoint", "/v1/responses/"},
	} {
		resp, body := f.do(tc.method, tc.path, "")
		var e errorBody
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		assert.Equal(t, tc.status, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.NotNil(t, e.Error.Code, body)
		assert.Equal(t, tc.code, *e.Error.Code, "%s %s", tc.method, tc.path)
		assert.Contains(t, e.Error.Message, tc.inMsg, "%s %s", tc.method, tc.path)
		if tc.status == http.StatusMethodNotAllowed {
			assert.Equal(t, tc.inMsg, resp.Header.Get("Allow"))
		}
	}
	var total int64
	for _, e := range f.engines {
		total += e.PathRequests("/v1/responses/resp_never") + e.PathRequests("/v1/responses/resp_x")
	}
	assert.Zero(t, total, "no engine asked about a response the gateway does not know")
	assert.Equal(t, 6.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "responses", "code": "200"})-1)

	// The replica that stored a response unhealthy: 503 naming it.
	resp = f.post("/v1/responses", `{"model":"`+testModel+`","input":"again"}`)
	out = readAll(t, resp)
	id, owner = front.ResponseID(out), resp.Header.Get(HeaderReplica)
	for _, e := range f.engines {
		if e.Name() == owner {
			e.SetHealthy(false)
		}
	}
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(context.Background())
	}
	resp, body := f.do(http.MethodGet, "/v1/responses/"+id, "")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	assert.Contains(t, body, `replica \"`+owner+`\"`)
}

// TestStoredReplicaRemoved: the replica that stored a response removed
// from the configuration, its id is forgotten: GET answers 404
// response_not_found naming the replica, and a continuation
// (previous_response_id) is routed as any other request, to a configured
// replica. Before, both got 503 no_healthy_replica until the id aged out,
// which clients retry.
func TestStoredReplicaRemoved(t *testing.T) {
	f := newFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{})
	store := func() (id, owner string) {
		resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"hello"}`)
		out := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
		return front.ResponseID(out), resp.Header.Get(HeaderReplica)
	}
	id, owner := store()
	id2, owner2 := store()
	for owner2 != owner {
		id2, owner2 = store()
	}
	var reps []config.Replica
	for _, e := range f.engines {
		if e.Name() != owner {
			reps = append(reps, config.Replica{Name: e.Name(), Address: e.URL()})
		}
	}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin, Replicas: reps}}}))
	resp, body := f.do(http.MethodGet, "/v1/responses/"+id, "")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	assert.Contains(t, body, "response_not_found")
	assert.Contains(t, body, `replica \"`+owner+`\"`)
	resp = f.post("/v1/responses", `{"model":"`+testModel+`","input":"more","previous_response_id":"`+id2+`"}`)
	out := readAll(t, resp)
	assert.NotEqual(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", out)
	assert.NotEqual(t, owner, resp.Header.Get(HeaderReplica))
	assert.NotEmpty(t, resp.Header.Get(HeaderReplica), "%s", out)
}

// TestStoredCORS: a browser may delete a stored response: the preflight
// allows DELETE.
func TestStoredCORS(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}, func(o *Options) { o.CORSOrigins = []string{"*"} })
	req, err := http.NewRequest(http.MethodOptions, f.http.URL+"/v1/responses/resp_1", nil)
	require.NoError(t, err)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", http.MethodDelete)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Access-Control-Allow-Methods"), http.MethodDelete)
}

// TestStoredBodyBound: a body sent about a stored response is bounded as
// any request's (413), before any engine is asked.
func TestStoredBodyBound(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}, func(o *Options) { o.MaxBodyBytes = 64 })
	resp, body := f.do(http.MethodPost, "/v1/responses/resp_1/cancel", strings.Repeat("x", 65))
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, body)
	assert.Contains(t, body, "exceeds 64 bytes")
}
