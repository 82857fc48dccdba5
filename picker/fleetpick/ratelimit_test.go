package fleetpick

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
	"github.com/stretchr/testify/require"
)

// TestRateLimit, as httpgw's: with Options.RateLimit each client (by the
// address Envoy appends last to X-Forwarded-For) gets its burst, then 429
// rate_limited with Retry-After, decided on the headers (a malformed body
// is not parsed) and before any engine; another client is not held back;
// embeddings count too, /v1/models does not; the refusals are on
// /metrics; time gives the burst back. Keyed by a header, the header
// tells clients apart.
func TestRateLimit(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		popts: Options{Clock: clock, RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 0.5, Burst: 2}}}})
	chat := chatBody(testModel, false, "hi")
	post := func(client, body string) (*http.Response, []byte) {
		resp := f.post("/v1/chat/completions", body, "X-Forwarded-For", "203.0.113.7, "+client)
		return resp, readAll(t, resp)
	}
	for i := range 2 {
		resp, b := post("192.0.2.1", chat)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d of the burst: %s", i, b)
	}
	engine := f.engines[0].Requests()
	resp, body := post("192.0.2.1", "not JSON")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "refused on its headers: %s", body)
	require.Equal(t, "2", resp.Header.Get("Retry-After"), "one interval, 2 s")
	require.Contains(t, string(body), `"code":"rate_limited"`)
	require.Contains(t, string(body), "rate limit of 0.5 requests/s (burst 2)")
	require.Equal(t, engine, f.engines[0].Requests(), "no engine reached")
	resp, body = post("192.0.2.2", chat)
	require.Equal(t, http.StatusOK, resp.StatusCode, "another client has its own burst: %s", body)
	resp = f.post("/v1/embeddings", `{"model":"m1","input":"x"}`, "X-Forwarded-For", "192.0.2.1")
	readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "embeddings count too")
	req, err := http.NewRequest(http.MethodGet, f.http.URL+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("X-Forwarded-For", "192.0.2.1")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "/v1/models is not limited")

	require.EqualValues(t, 2, f.counter("exa_gateway_rate_limited_total", nil))
	require.EqualValues(t, 1, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "chat", "code": "429"}))
	require.EqualValues(t, 1, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "embeddings", "code": "429"}))

	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	resp, _ = post("192.0.2.1", chat)
	require.Equal(t, http.StatusOK, resp.StatusCode, "one interval later, one more")
	resp, _ = post("192.0.2.1", chat)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

	h := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		popts: Options{Clock: clock, RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 0.5, Burst: 1}, Key: "header:X-Api-Key"}}})
	for _, tc := range []struct {
		key  string
		want int
	}{{"a", 200}, {"a", 429}, {"b", 200}} {
		resp := h.post("/v1/chat/completions", chat, "X-Api-Key", tc.key, "X-Forwarded-For", "192.0.2.9")
		readAll(t, resp)
		require.Equal(t, tc.want, resp.StatusCode, "key %s", tc.key)
	}
}

func TestRateLimitInvalid(t *testing.T) {
	_, err := New(newFleet(t, nil, fleet.Options{}), Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1}}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "RateLimit: ")
}

// A request refused on its headers while Envoy is still sending its body
// in chunks gets its 429 (pickertest's Envoy read the stream's end as an
// error, a 500, in 18 of 20 runs).
func TestRateLimitWhileBodySent(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		popts: Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1e-3, Burst: 1}}}})
	f.envoy.Chunk = 16
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "hi"), "X-Forwarded-For", "192.0.2.1")
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for range 5 {
		resp = f.post("/v1/chat/completions", chatBody(testModel, false, strings.Repeat("x", 64<<10)), "X-Forwarded-For", "192.0.2.1")
		b := readAll(t, resp)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	}
}

// A method other than POST on a prompt or pass-through endpoint gets 405
// and spends nothing of the client's rate, as at the HTTP gateway (it
// was limited: the GETs spent the burst).
func TestRateLimitWrongMethod(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		popts: Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1e-3, Burst: 1}}}})
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings", "/v1/chat/completions"} {
		req, err := http.NewRequest(http.MethodGet, f.http.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("X-Forwarded-For", "192.0.2.1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b := readAll(t, resp)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "GET %s: %s", path, b)
	}
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "hi"), "X-Forwarded-For", "192.0.2.1")
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the burst is whole: %s", b)
	require.EqualValues(t, 0, f.counter("exa_gateway_rate_limited_total", nil))
}

// With Envoy's source.address attribute the client is that address, not
// X-Forwarded-For, which a client can set: a client changing its
// X-Forwarded-For is still limited, another address has its own rate.
func TestRateLimitBySourceAddress(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		popts: Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1e-3, Burst: 1}}}})
	send := func(src, xff string) int {
		x, err := f.client.Open(context.Background())
		require.NoError(t, err)
		defer x.Close()
		r, err := x.Request(pickertest.Request{Body: []byte(chatBody(testModel, false, "hi")),
			Header: []picker.Header{{Name: "x-forwarded-for", Value: xff}}, Attributes: pickertest.SourceAttributes(src)})
		require.NoError(t, err)
		if r.Immediate != nil {
			return int(r.Immediate.GetStatus().GetCode())
		}
		_, err = x.Respond(200, "application/json", []byte(`{}`))
		require.NoError(t, err)
		return 200
	}
	require.Equal(t, 200, send("192.0.2.1:1000", "10.0.0.1"))
	require.Equal(t, 429, send("192.0.2.1:2000", "10.0.0.2"), "the same address under another X-Forwarded-For")
	require.Equal(t, 200, send("192.0.2.2:1000", "10.0.0.1"), "another address, the first one's X-Forwarded-For")
}

// CheckHead allocates nothing for a request it admits, its client from
// X-Forwarded-For (an address without a port) or from source.address
// (it was 2: the header slice boxed, and a failed host:port parse).
func TestCheckHeadAllocatesNothing(t *testing.T) {
	r, err := New(newFleet(t, nil, fleet.Options{}), Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1e9, Burst: 1 << 30}},
		Clock: func() time.Time { return time.Unix(1e9, 0) }})
	require.NoError(t, err)
	for _, req := range []*picker.PickRequest{
		{Method: "POST", Path: "/v1/chat/completions", Header: picker.Headers{{Name: "x-forwarded-for", Value: "10.0.0.1, 192.0.2.1"}}},
		{Method: "POST", Path: "/v1/embeddings", ClientAddress: "192.0.2.2:5000"},
	} {
		n := testing.AllocsPerRun(200, func() { require.NoError(t, r.CheckHead(req)) })
		require.Zero(t, n, "%s", req.Path)
	}
}
