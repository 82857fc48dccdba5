package picker

import (
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	gie "sigs.k8s.io/gateway-api-inference-extension/test/integration"
)

// These tests drive the picker with GIE v1.5.0's own integration-test
// helpers (test/integration/util.go): its request builders, which play
// Envoy's message sequence, and its expected-response builders, which say
// what an endpoint picker answers. Equality is proto.Equal, header options
// compared in key order as GIE's hermetic tests compare them.

func sortedHeaders(m *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	m = proto.Clone(m).(*extprocv3.ProcessingResponse)
	if hm := m.GetRequestHeaders().GetResponse().GetHeaderMutation(); hm != nil {
		slices.SortFunc(hm.SetHeaders, func(a, b *corev3.HeaderValueOption) int {
			return strings.Compare(a.GetHeader().GetKey(), b.GetHeader().GetKey())
		})
	}
	return m
}

func TestGIEConformance(t *testing.T) {
	for _, tc := range []struct {
		name   string
		subset []string
		want   int // replica picked; -1: 503
	}{
		{name: "whole pool", want: 0},
		{name: "subset", subset: []string{endpointN(2)}, want: 2},
		{name: "subset of two", subset: []string{endpointN(1), "10.0.0.3:8000"}, want: -2},
		{name: "empty subset", subset: []string{}, want: -1},
		{name: "ineligible subset", subset: []string{"192.0.2.1:8000"}, want: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 3
			if tc.subset == nil {
				n = 1
			}
			gw := newGateway(t, n)
			h := startPicker(t, newRouter(t, gw, 0), Options{})
			reqs := gie.GenerateStreamedRequestSet(logr.Discard(), "Say one word.", "m1", "", tc.subset)
			body := reqs[1].GetRequestBody().GetBody()
			if tc.want == -1 {
				got, err := gie.StreamedRequest(t, h.open(t).stream, reqs, 1)
				if err != nil || len(got) != 1 {
					t.Fatalf("%d responses, %v", len(got), err)
				}
				want := gie.NewImmediateErrorResponse(typev3.StatusCode_ServiceUnavailable, "")[0]
				if g, w := got[0].GetImmediateResponse().GetStatus(), want.GetImmediateResponse().GetStatus(); !proto.Equal(g, w) {
					t.Fatalf("status %v, want %v", g, w)
				}
				return
			}
			got, err := gie.StreamedRequest(t, h.open(t).stream, reqs, 2)
			if err != nil || len(got) != 2 {
				t.Fatalf("%d responses, %v", len(got), err)
			}
			ep := ""
			if tc.want >= 0 {
				ep = endpointN(tc.want)
			} else { // either subset member
				ep = string(got[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue())
				if !slices.Contains(tc.subset, ep) {
					t.Fatalf("picked %q outside %v", ep, tc.subset)
				}
			}
			want := gie.NewRequestBufferedResponse(ep, body)
			for i := range want {
				if !proto.Equal(sortedHeaders(got[i]), sortedHeaders(want[i])) {
					t.Errorf("response %d:\n got %v\nwant %v", i, got[i], want[i])
				}
			}
		})
	}
}

// TestGIEResponsePhase: the response phase answers as GIE's expectations
// for a streamed response: the headers acknowledged, each chunk echoed.
func TestGIEResponsePhase(t *testing.T) {
	gw := newGateway(t, 1)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	e := h.open(t)
	reqs := gie.GenerateStreamedRequestSet(logr.Discard(), "hello", "m1", "", nil)
	if _, err := gie.StreamedRequest(t, e.stream, reqs, 2); err != nil {
		t.Fatal(err)
	}
	chunks := []string{"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "data: [DONE]\n\n"}
	resp := []*extprocv3.ProcessingRequest{respHeaders(false, ":status", "200", "content-type", "text/event-stream")}
	for i, c := range chunks {
		resp = append(resp, respBody([]byte(c), i == len(chunks)-1))
	}
	got, err := gie.StreamedRequest(t, e.stream, resp, 3)
	if err != nil || len(got) != 3 {
		t.Fatalf("%d responses, %v", len(got), err)
	}
	if got[0].GetResponseHeaders() == nil || got[0].GetResponseHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Errorf("response headers answer %v, want an unchanged headers response", got[0])
	}
	for i, c := range chunks {
		if want := gie.NewResponseStreamChunk(c, i == len(chunks)-1); !proto.Equal(got[i+1], want) {
			t.Errorf("chunk %d:\n got %v\nwant %v", i, got[i+1], want)
		}
	}
	waitInFlight(t, gw)
}
