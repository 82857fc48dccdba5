package httpgw

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/front"
)

// storingEngines is a Transport answering every Responses API request
// with a new response id, as engines storing responses do.
type storingEngines struct{ n atomic.Int64 }

func (e *storingEngines) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	body := fmt.Sprintf(`{"id":"resp_%d","object":"response","status":"completed"}`, e.n.Add(1))
	return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, ContentLength: int64(len(body)),
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

// TestResponsesPinsSurviveFlood (issue 29, N4): 30 clients' conversations
// (one address each) continue on the replica that stored them after
// another client sent 65,536 Responses API requests through the gateway;
// round-robin would move about two thirds of them. With the
// first-in-first-out table every pin was forgotten.
func TestResponsesPinsSurviveFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("65,536 requests")
	}
	reg := prometheus.NewRegistry()
	s, err := New(Options{Transport: &storingEngines{}, Registerer: reg, Gatherer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin,
		Replicas: []config.Replica{{Name: "e0", Address: "http://10.0.0.1:8000"}, {Name: "e1", Address: "http://10.0.0.2:8000"}, {Name: "e2", Address: "http://10.0.0.3:8000"}}}}}))
	post := func(client, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(body))
		req.RemoteAddr = client + ":40000"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
		return w
	}
	var ids, owners [30]string
	for i := range 30 {
		w := post(fmt.Sprintf("10.1.0.%d", i), fmt.Sprintf(`{"model":"m1","input":"conversation %d"}`, i))
		ids[i], owners[i] = front.ResponseID(w.Body.Bytes()), w.Header().Get(HeaderReplica)
		require.NotEmpty(t, ids[i])
	}
	for range front.MaxResponseIDs {
		post("10.9.9.9", `{"model":"m1","input":"flood"}`)
	}
	kept := 0
	for i := range 30 {
		w := post(fmt.Sprintf("10.1.0.%d", i), fmt.Sprintf(`{"model":"m1","input":"and then?","previous_response_id":%q}`, ids[i]))
		if w.Header().Get(HeaderReplica) == owners[i] {
			kept++
		}
	}
	require.Equal(t, 30, kept, "conversations continued on their replica, of 30")
}
