package picker

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentStreams runs many exchanges at once over one connection,
// some completed, some abandoned mid-response, against one GatewayRouter
// with subset hints and fallbacks: under -race this checks the Server, the
// pooled exchanges and the router are safe for concurrent use, and at the
// end no load stays booked.
func TestConcurrentStreams(t *testing.T) {
	gw := newGateway(t, 4)
	h := startPicker(t, newRouter(t, gw, 2), Options{MaxFallbacks: 2})
	const workers, each = 6, 15
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				e := h.open(t)
				var md *corev3Metadata
				if i%3 == 0 {
					md = subsetMD(t, []any{endpointN(w % 4), endpointN((w + 1) % 4)})
				}
				r := e.request(md, chat(fmt.Sprintf("sys %d", w), fmt.Sprint(i), "q"), 0)
				if r.immediate != nil || r.dest != r.metaDest {
					errs <- fmt.Errorf("worker %d request %d: %+v", w, i, r)
					e.cancel()
					continue
				}
				if i%4 == 3 {
					e.cancel() // client gone before the response
					continue
				}
				e.respond("text/event-stream", []byte("data: a\n\n"), []byte("data: [DONE]\n\n"))
				e.cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitInFlight(t, gw)
	if st := gw.Stats(); st.Routed != workers*each {
		t.Errorf("routed %d, want %d", st.Routed, workers*each)
	}
}
