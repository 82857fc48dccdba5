package fleetpick

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestFrontsDecideAlike: the same requests, one at a time, through the
// HTTP gateway and through the endpoint picker behind Envoy (played by
// pickertest.Envoy) over fresh fleets of the same configuration: each
// front answers with the same replica and the same decision text
// (X-Exa-Replica, X-Exa-Decision), so the two can be compared from
// outside.
func TestFrontsDecideAlike(t *testing.T) {
	gw := newGatewayFixture(t, 4)
	pk := newPickFixture(t, 4, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for round := range 3 {
		for i, b := range fronttest.FrontBodies {
			name := fmt.Sprintf("round %d body %d", round, i)
			var hdr []string
			if b.Session != "" {
				hdr = []string{keys.HeaderSessionID, b.Session}
			}
			both := func(name, body string, want int) (idG, idP string) {
				rg := gw.post(b.Path, body, hdr...)
				og := readAll(t, rg)
				gw.settle() // the request is done: its load released
				rp := pk.post(b.Path, body, hdr...)
				op := readAll(t, rp)
				pk.waitIdle()
				require.Equal(t, want, rg.StatusCode, name)
				require.Equal(t, want, rp.StatusCode, name)
				require.NotEmpty(t, rp.Header.Get(front.HeaderDecision), name)
				require.Equal(t, rg.Header.Get(front.HeaderReplica), rp.Header.Get(front.HeaderReplica), name)
				require.Equal(t, rg.Header.Get(front.HeaderDecision), rp.Header.Get(front.HeaderDecision), name)
				return front.ResponseID(og), front.ResponseID(op)
			}
			want := http.StatusOK
			if strings.Contains(b.Body, "previous_response_id") {
				want = http.StatusNotFound // an id no engine stored: routed by key, the engine's 404
			}
			idG, idP := both(name, b.Body, want)
			if b.Path != "/v1/responses" || want != http.StatusOK {
				continue
			}
			// The conversation continued through each front, from the
			// response that front got, goes alike to where it is stored.
			require.Equal(t, idG, idP, name)
			require.NotEmpty(t, idG, name)
			cont := `{"model":"m1","input":"and then?","previous_response_id":"` + idG + `"}`
			both(name+" continued", cont, http.StatusOK)
		}
	}
}

// gatewayFixture is the HTTP gateway (httpgw.Server) serving testModel,
// cache-aware, over fake engines, as a client reaches it.
type gatewayFixture struct {
	t        *testing.T
	url      string
	handlers sync.WaitGroup
}

func newGatewayFixture(t *testing.T, n int) *gatewayFixture {
	t.Helper()
	var reps []config.Replica
	for i := range n {
		e := enginetest.New(enginetest.Options{Model: testModel, Name: "e" + strconv.Itoa(i)})
		t.Cleanup(e.Close)
		reps = append(reps, config.Replica{Name: e.Name(), Address: e.URL()})
	}
	reg := prometheus.NewRegistry()
	s, err := httpgw.New(httpgw.Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	f := &gatewayFixture{t: t}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f
}

func (f *gatewayFixture) post(path, body string, hdr ...string) *http.Response {
	f.t.Helper()
	return fronttest.Post(f.t, f.url, path, body, hdr...)
}

// settle waits for the gateway's handlers to finish their bookkeeping.
func (f *gatewayFixture) settle() { f.handlers.Wait() }
