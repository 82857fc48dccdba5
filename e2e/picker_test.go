//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// TestPicker runs `exa serve picker`, the real exa binary, over three
// llm-d-inference-sim engines. No Envoy binary exists on this project's
// machines: Envoy is played by pickertest.Envoy, a Go ext_proc client in
// this test process that sends each request's headers and body to the
// picker over gRPC in Envoy's FULL_DUPLEX_STREAMED sequence, sends the
// request to the engine the picker named (as Envoy's ORIGINAL_DST cluster
// would), and feeds the response back through the picker (response
// headers, body chunks, end of stream). One subtest plays the exchange
// message by message instead.

// pickerProc is a running `exa serve picker`.
type pickerProc struct {
	*gatewayProc // its admin listener: /metrics, /stats, /healthz
	addr         string
	client       *pickertest.Client
}

// startPickerProc starts `exa serve picker` on cfg with extra flags and
// waits for its admin /healthz and its gRPC health status, over plaintext.
func startPickerProc(t *testing.T, name, cfg string, args ...string) *pickerProc {
	t.Helper()
	return startPickerProcCreds(t, name, cfg, insecure.NewCredentials(), args...)
}

// startPickerProcCreds is startPickerProc with the gRPC client's
// transport credentials (TLS for a picker started with --tls-*).
func startPickerProcCreds(t *testing.T, name, cfg string, creds credentials.TransportCredentials, args ...string) *pickerProc {
	t.Helper()
	return startPickerProcBin(t, name, exaBin, cfg, creds, args...)
}

// startPickerProcBin is startPickerProcCreds with the exa binary to run
// (another build, to compare two versions in one run).
func startPickerProcBin(t *testing.T, name, bin, cfg string, creds credentials.TransportCredentials, args ...string) *pickerProc {
	t.Helper()
	port, admin := freePort(t), freePort(t)
	pp := &pickerProc{addr: "127.0.0.1:" + strconv.Itoa(port)}
	all := append([]string{"serve", "picker", "--listen", pp.addr, "--admin-listen", "127.0.0.1:" + strconv.Itoa(admin),
		"--reload-interval", "100ms", "--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", "200ms"}, args...)
	p := startProc(t, name, []string{"EXA_CONFIG=" + cfg}, bin, all...)
	pp.gatewayProc = &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(admin), p: p}
	waitFor(t, 20*time.Second, name+" /healthz", func() bool { return get(pp.url+"/healthz") == http.StatusOK })
	conn, err := grpc.NewClient(pp.addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	waitFor(t, 10*time.Second, name+" gRPC health", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: picker.ServiceName})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	pp.client = pickertest.NewClient(conn)
	return pp
}

// envoy starts pickertest.Envoy in front of the picker and returns its
// URL. Header X-Test-Subset ("ip:port,..." or "none" for an empty list)
// becomes the request's subset hint.
func (pp *pickerProc) envoy(t *testing.T, fallbacks bool) string {
	e := &pickertest.Envoy{Client: pp.client, Fallbacks: fallbacks, Metadata: func(r *http.Request) *corev3.Metadata {
		switch h := r.Header.Get("X-Test-Subset"); h {
		case "":
			return nil
		case "none":
			return pickertest.SubsetMetadata()
		default:
			return pickertest.SubsetMetadata(strings.Split(h, ",")...)
		}
	}}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

// inFlight sums the replicas' in_flight in /stats.
func (pp *pickerProc) inFlight(t *testing.T) int {
	n := 0
	for _, m := range pp.stats(t).Models {
		for _, r := range m.Replicas {
			n += r.InFlight
		}
	}
	return n
}

// picked is one request's outcome through Envoy.
type picked struct {
	status   int
	endpoint string // the endpoint that served (X-Pickertest-Endpoint)
	picked   string // the picker's x-gateway-destination-endpoint
	body     []byte
}

// pickChat sends one chat request through Envoy and reads the answer.
func pickChat(t *testing.T, url string, body []byte, hdr ...string) picked {
	t.Helper()
	resp, err := client.Do(chatRequest(t, url, body, hdr...))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return picked{status: resp.StatusCode, endpoint: resp.Header.Get(pickertest.HeaderEndpoint),
		picked: resp.Header.Get(pickertest.HeaderPicked), body: b}
}

func chatJSON(system, user string, stream bool, maxTokens int) []byte {
	// ignore_eos: the answer is maxTokens long, so that a long one is still
	// streaming when a test cancels it.
	b, _ := json.Marshal(map[string]any{"model": simModel, "stream": stream, "max_tokens": maxTokens, "ignore_eos": true,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
	return b
}

func TestPicker(t *testing.T) {
	requireBinaries(t)
	cfg := filepath.Join(t.TempDir(), "routing.json")
	var sims []*sim
	eps := map[string]int{} // ip:port to sim
	args := []string{"serve", "routing", "set", simModel, "--mode", "cache_aware"}
	for i := range 3 {
		port := freePort(t)
		// Large enough for a 12,000-word prompt (over 62 KB), prefilled
		// quickly.
		s := startSim(t, port, append(simArgs(port, 2048, 20*time.Microsecond), "--max-model-len", "65536"))
		sims = append(sims, s)
		eps["127.0.0.1:"+strconv.Itoa(port)] = i
		args = append(args, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	exa(t, cfg, args...)
	exa(t, cfg, "serve", "routing", "set", "empty", "--mode", "cache_aware")
	pp := startPickerProc(t, "picker", cfg)
	for _, s := range sims {
		waitFor(t, 20*time.Second, "picker to admit "+s.url(), func() bool { h, _ := pp.engineHealthy(t, s.url()); return h })
	}
	url := pp.envoy(t, false)
	system := func(g int) string {
		return fmt.Sprintf("You are picker assistant %d. ", g) + strings.Repeat(fmt.Sprintf("fact%d about the matter at hand; ", g), 40)
	}
	home := map[int]string{} // group to endpoint

	t.Run("models", func(t *testing.T) {
		resp, err := client.Get(url + "/v1/models")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.Empty(t, resp.Header.Get(pickertest.HeaderPicked), "the picker answered it itself")
		require.Contains(t, string(b), `"id": "`+simModel+`"`)
	})

	t.Run("affinity", func(t *testing.T) {
		// The engines have served nothing yet: their prefix-cache
		// counters start at zero (and appear with the first request).
		const groups, per = 8, 3
		for r := range per {
			for g := range groups {
				p := pickChat(t, url, chatJSON(system(g), fmt.Sprintf("question %d", r), r%2 == 0, 4))
				require.Equal(t, http.StatusOK, p.status, "%s", p.body)
				_, ok := eps[p.endpoint]
				require.True(t, ok, "served by %q, not an engine", p.endpoint)
				if r == 0 {
					home[g] = p.endpoint
				} else {
					require.Equal(t, home[g], p.endpoint, "group %d: the same prefix goes to the same engine", g)
				}
				if r%2 == 0 {
					require.Contains(t, string(p.body), "data: [DONE]")
				}
			}
		}
		used := map[string]bool{}
		for _, ep := range home {
			used[ep] = true
		}
		require.GreaterOrEqual(t, len(used), 2, "groups spread over the engines: %v", home)
		h1, q1 := 0.0, 0.0
		for _, s := range sims {
			if !used[strings.TrimPrefix(s.url(), "http://")] {
				continue // never served: no counters yet
			}
			h, q := engineCounters(t, s.url())
			h1, q1 = h1+h, q1+q
		}
		ratio := h1 / q1
		t.Logf("engines' prefix-cache hit ratio over %d requests: %.3f (%v of %v tokens)", groups*per, ratio, h1, q1)
		require.Greater(t, ratio, 0.5, "two of three requests per group repeat a cached prefix on its engine")
		waitFor(t, 5*time.Second, "requests to settle", func() bool { return pp.inFlight(t) == 0 })
		require.Equal(t, float64(groups*per), pp.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel, "code": "200"}))
		require.Equal(t, float64(groups*per), pp.metric(t, "exa_gateway_replica_requests_total", map[string]string{"model": simModel}))
		require.Equal(t, uint64(groups*per), pp.stats(t).Models[simModel].Requests)
	})

	t.Run("subset hints", func(t *testing.T) {
		body := chatJSON(system(0), "a subset question", false, 2)
		var other string
		for ep := range eps {
			if ep != home[0] {
				other = ep
				break
			}
		}
		for _, tc := range []struct {
			name, subset string
			status       int
			want         string
		}{
			{"home allowed", home[0] + "," + other, 200, home[0]},
			{"address only", "127.0.0.1", 200, home[0]},
			// Last: routing there makes the other engine hold the prefix too.
			{"home left out", other, 200, other},
			{"empty", "none", 503, ""},
			{"ineligible", "192.0.2.1:8000", 503, ""},
		} {
			p := pickChat(t, url, body, "X-Test-Subset", tc.subset)
			require.Equal(t, tc.status, p.status, "%s: %s", tc.name, p.body)
			require.Equal(t, tc.want, p.endpoint, tc.name)
		}
	})

	t.Run("errors", func(t *testing.T) {
		p := pickChat(t, url, []byte(`{"model":"empty","messages":[{"role":"user","content":"x"}]}`))
		require.Equal(t, http.StatusServiceUnavailable, p.status, "%s", p.body)
		require.Contains(t, string(p.body), `model \"empty\" has no replicas`)
		p = pickChat(t, url, []byte(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`))
		require.Equal(t, http.StatusNotFound, p.status, "%s", p.body)
		require.Contains(t, string(p.body), "model_not_found")
	})

	t.Run("body over 62 KB", func(t *testing.T) {
		big := "You are a very thorough assistant. " + words("w", 12000)
		body := chatJSON(big, "summarise", false, 2)
		require.Greater(t, len(body), picker.MaxChunkBytes)
		// Through Envoy, twice: the same engine, the whole prompt cached
		// the second time.
		first := pickChat(t, url, body)
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		second := pickChat(t, url, body)
		require.Equal(t, http.StatusOK, second.status, "%s", second.body)
		require.Equal(t, first.endpoint, second.endpoint)
		var answer struct {
			Usage struct {
				Prompt  int `json:"prompt_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(second.body, &answer))
		require.Greater(t, answer.Usage.Prompt, 12000)
		require.GreaterOrEqual(t, answer.Usage.Details.Cached, answer.Usage.Prompt-32, "the engine received the whole body and cached it")

		// Message by message, from a client that streams (one that does
		// not has its body rewritten to stream and its answer assembled:
		// TestPickerUpstreamStream): the body comes back in chunks of at
		// most 62,000 bytes, unchanged, and goes to the engine named; the
		// answer comes back unchanged.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		x, err := pp.client.Open(ctx)
		require.NoError(t, err)
		sbody, err := keys.StreamBody(body)
		require.NoError(t, err)
		r, err := x.Request(pickertest.Request{Body: sbody, Header: []picker.Header{{Name: "content-type", Value: "application/json"}}})
		require.NoError(t, err)
		require.Nil(t, r.Immediate)
		require.Equal(t, first.endpoint, r.Endpoint)
		require.Equal(t, r.Endpoint, r.MetadataEndpoint)
		require.True(t, r.ClearRouteCache)
		require.Equal(t, sbody, r.Body)
		require.Greater(t, len(r.Chunks), 1)
		for _, c := range r.Chunks {
			require.LessOrEqual(t, c, picker.MaxChunkBytes)
		}
		resp, err := client.Post("http://"+r.Endpoint+"/v1/chat/completions", "application/json", bytes.NewReader(r.Body))
		require.NoError(t, err)
		ans, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.NoError(t, x.ResponseHeaders(resp.StatusCode, []picker.Header{{Name: "content-type", Value: resp.Header.Get("Content-Type")}}, nil, false))
		echoed, err := x.ResponseBody(ans, true)
		require.NoError(t, err)
		require.Equal(t, ans, echoed)
		require.NoError(t, x.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
	})

	t.Run("client cancellation", func(t *testing.T) {
		waitFor(t, 5*time.Second, "earlier requests to settle", func() bool { return pp.inFlight(t) == 0 })
		before := pp.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel, "reason": "stream_ended"})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
			bytes.NewReader(chatJSON(system(1), "a long answer please", true, 4000)))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
		}
		require.Equal(t, 1, pp.inFlight(t), "in flight while streaming")
		cancel()
		resp.Body.Close()
		waitFor(t, 10*time.Second, "in_flight back to 0 in /stats", func() bool { return pp.inFlight(t) == 0 })
		waitFor(t, 5*time.Second, "the in-flight gauge back to 0", func() bool {
			return pp.metric(t, "exa_gateway_in_flight_requests", nil) == 0
		})
		require.Equal(t, before+1, pp.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel, "reason": "stream_ended"}))
	})

	t.Run("shed 429", func(t *testing.T) {
		shed := startPickerProc(t, "picker-shed", cfg, "--shed-above", "1")
		for _, s := range sims {
			waitFor(t, 20*time.Second, "picker-shed to admit "+s.url(), func() bool { h, _ := shed.engineHealthy(t, s.url()); return h })
		}
		surl := shed.envoy(t, false)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, surl+"/v1/chat/completions",
			bytes.NewReader(chatJSON(system(2), "a long answer please", true, 4000)))
		require.NoError(t, err)
		req.Header.Set("X-Test-Subset", home[2])
		resp, err := client.Do(req)
		require.NoError(t, err)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
		}
		p := pickChat(t, surl, chatJSON(system(2), "another", false, 2), "X-Test-Subset", home[2])
		require.Equal(t, http.StatusTooManyRequests, p.status, "%s", p.body)
		require.Contains(t, string(p.body), "is saturated: no eligible replica has room (outstanding")
		p = pickChat(t, surl, chatJSON(system(2), "another", false, 2))
		require.Equal(t, http.StatusOK, p.status, "other engines are free: %s", p.body)
		cancel()
		resp.Body.Close()
		waitFor(t, 10*time.Second, "picker-shed idle", func() bool { return shed.inFlight(t) == 0 })
		require.Equal(t, 1.0, shed.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel, "code": "429"}))
	})

	t.Run("tls self-signed", func(t *testing.T) {
		// As GIE's gateways reach their own picker: TLS, the self-signed
		// certificate not verified (Istio's DestinationRule
		// insecureSkipVerify, Envoy's UpstreamTlsContext without a CA).
		tp := startPickerProcCreds(t, "picker-tls", cfg, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}), "--tls-self-signed")
		for _, s := range sims {
			waitFor(t, 20*time.Second, "picker-tls to admit "+s.url(), func() bool { h, _ := tp.engineHealthy(t, s.url()); return h })
		}
		turl := tp.envoy(t, false)
		first := pickChat(t, turl, chatJSON(system(5), "over TLS", false, 2))
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		_, ok := eps[first.endpoint]
		require.True(t, ok, "served by %q, not an engine", first.endpoint)
		again := pickChat(t, turl, chatJSON(system(5), "over TLS again", true, 2))
		require.Equal(t, http.StatusOK, again.status, "%s", again.body)
		require.Equal(t, first.endpoint, again.endpoint, "the same prefix goes to the same engine")
		waitFor(t, 5*time.Second, "picker-tls idle", func() bool { return tp.inFlight(t) == 0 })
		require.Equal(t, 2.0, tp.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel, "code": "200"}))

		plain, err := grpc.NewClient(tp.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer plain.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{Service: picker.ServiceName})
		require.Equal(t, codes.Unavailable, status.Code(err), "a plaintext client is refused: %v", err)
	})

	t.Run("fallback", func(t *testing.T) {
		// A picker without probes or scrapes (one at start, then hourly),
		// so that nothing but the data plane's reports tells it of the
		// killed engine (a scrape between the kill and a pick is the
		// likeliest cause of one failure in CI, where try 0 went to
		// another engine), offering a fallback, and an Envoy that tries
		// it: passive health only.
		fb := startPickerProc(t, "picker-fallback", cfg, "--max-fallbacks", "1", "--probe-interval", "1h", "--scrape-interval", "1h", "--eject-after", "2")
		for _, s := range sims {
			waitFor(t, 20*time.Second, "picker-fallback to admit "+s.url(), func() bool { h, _ := fb.engineHealthy(t, s.url()); return h })
		}
		furl := fb.envoy(t, true)
		body := chatJSON(system(3), "where now?", false, 2)
		p := pickChat(t, furl, body)
		require.Equal(t, http.StatusOK, p.status)
		list := strings.Split(p.picked, ",")
		require.Len(t, list, 2, "the endpoint and one fallback: %q", p.picked)
		dead := list[0]
		sims[eps[dead]].kill()
		for i := range 2 {
			p := pickChat(t, furl, body)
			require.Equal(t, http.StatusOK, p.status, "%s", p.body)
			require.Equal(t, dead, strings.Split(p.picked, ",")[0], "try %d: the picker does not know yet", i)
			require.NotEqual(t, dead, p.endpoint, "the fallback served")
		}
		// The client has its answer before Envoy ends the exchange: wait.
		waitFor(t, 5*time.Second, "two failures reported by the data plane to eject the engine (--eject-after 2)", func() bool {
			h, _ := fb.engineHealthy(t, "http://"+dead)
			return !h
		})
		p = pickChat(t, furl, body)
		require.Equal(t, http.StatusOK, p.status)
		require.NotContains(t, p.picked, dead, "no longer picked")

		// The first picker probes: it ejects the engine and sends the
		// group elsewhere, with no fallback list (plain ORIGINAL_DST).
		waitFor(t, 10*time.Second, "picker to eject "+dead, func() bool { h, _ := pp.engineHealthy(t, "http://"+dead); return !h })
		p = pickChat(t, url, body)
		require.Equal(t, http.StatusOK, p.status, "%s", p.body)
		require.NotEqual(t, dead, p.endpoint)
		waitFor(t, 10*time.Second, "pickers idle", func() bool { return pp.inFlight(t) == 0 && fb.inFlight(t) == 0 })
	})
}
