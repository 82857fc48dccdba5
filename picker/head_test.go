package picker

import (
	"bytes"
	"context"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// headTracker records what a HeadTracker is given; it has enough once it
// has seen want, or never when want is "".
type headTracker struct {
	countTracker
	statuses []int
	chunks   [][]byte
	want     string
	late     bool // called after Done
}

func (h *headTracker) ResponseHead(status int, chunk []byte) bool {
	if h.done > 0 {
		h.late = true
	}
	h.statuses = append(h.statuses, status)
	h.chunks = append(h.chunks, bytes.Clone(chunk))
	return h.want != "" && bytes.Contains(bytes.Join(h.chunks, nil), []byte(h.want))
}

// headRouter picks 10.0.0.1:8000 with a headTracker, or a plain Tracker.
type headRouter struct {
	want  string
	plain bool
	t     *headTracker
	c     *countTracker
}

func (r *headRouter) Pick(context.Context, *PickRequest) (Pick, error) {
	if r.plain {
		r.c = &countTracker{}
		return Pick{Endpoint: endpointN(0), Tracker: r.c}, nil
	}
	r.t = &headTracker{want: r.want}
	return Pick{Endpoint: endpointN(0), Tracker: r.t}, nil
}

// serveResponse serves one exchange from memory: a request, then a 200
// response of contentType in the given body chunks.
func serveResponse(t *testing.T, r Router, status string, contentType string, chunks ...[]byte) []*extprocv3.ProcessingResponse {
	t.Helper()
	s, err := New(r, Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, nil, ":path", "/v1/responses", ":method", "POST"), reqBody([]byte(`{}`), true),
		respHeaders(false, ":status", status, "content-type", contentType)}
	for i, c := range chunks {
		msgs = append(msgs, respBody(c, i == len(chunks)-1))
	}
	st := &memStream{ctx: context.Background(), msgs: msgs}
	if err := s.serve(st); err != nil {
		t.Fatal(err)
	}
	return st.sent
}

// TestHeadTracker: a HeadTracker is given the response's status and body
// chunks in order, before Done, until it has enough or MaxResponseHead
// bytes are given (the chunk that crosses it cut); the body is echoed
// unchanged either way.
func TestHeadTracker(t *testing.T) {
	t.Run("enough", func(t *testing.T) {
		r := &headRouter{want: "resp_1"}
		serveResponse(t, r, "200", "text/event-stream", []byte("event: response.created\n"), []byte(`data: {"response":{"id":"resp_1"}}`), []byte("more"), []byte("end"))
		h := r.t
		if len(h.chunks) != 2 || string(h.chunks[0]) != "event: response.created\n" || h.statuses[0] != 200 || h.statuses[1] != 200 {
			t.Fatalf("chunks %q statuses %v: want the two up to the id, with status 200", h.chunks, h.statuses)
		}
		if h.done != 1 || h.late {
			t.Fatalf("done %d, called after Done %v", h.done, h.late)
		}
	})
	t.Run("bound", func(t *testing.T) {
		r := &headRouter{}
		big := []byte(strings.Repeat("a", MaxResponseHead-10))
		sent := serveResponse(t, r, "404", "application/json", big, []byte(strings.Repeat("b", 30)), []byte("c"))
		h := r.t
		if len(h.chunks) != 2 || len(h.chunks[0])+len(h.chunks[1]) != MaxResponseHead || string(h.chunks[1]) != strings.Repeat("b", 10) {
			t.Fatalf("%d chunks: want %d bytes in two, the second cut", len(h.chunks), MaxResponseHead)
		}
		if h.statuses[0] != 404 || h.done != 1 || h.late {
			t.Fatalf("statuses %v done %d late %v", h.statuses, h.done, h.late)
		}
		var echoed []byte
		for _, m := range sent {
			echoed = append(echoed, m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		if want := len(big) + 31; len(echoed) != want {
			t.Fatalf("echoed %d bytes, want %d", len(echoed), want)
		}
	})
	t.Run("last chunk", func(t *testing.T) {
		// The chunk that ends the response is given before Done.
		r := &headRouter{}
		serveResponse(t, r, "200", "application/json", []byte(`{"id":"resp_2"}`))
		if h := r.t; len(h.chunks) != 1 || h.done != 1 || h.late {
			t.Fatalf("chunks %q done %d late %v", h.chunks, h.done, h.late)
		}
	})
}
