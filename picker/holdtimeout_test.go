package picker

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// holdRouter holds every Pick until its context ends, as a Router with
// flow control holds a request in its queue (fleetpick), and answers
// then with the context's error, as fleetpick answers a held request
// whose stream went away.
type holdRouter struct{ entered chan struct{} }

func (r holdRouter) Pick(ctx context.Context, _ *PickRequest) (Pick, error) {
	r.entered <- struct{}{}
	<-ctx.Done()
	return Pick{}, fmt.Errorf("held until: %w", ctx.Err())
}

// TestRequestTimeoutWhileHeld: RequestTimeout bounds the request phase up
// to the picker's answer, the Router's Pick included: a request a Router
// holds (flow control's queue) when it passes is answered 408 then, the
// Pick's context ended so that the Router lets it go, and counted.
func TestRequestTimeoutWhileHeld(t *testing.T) {
	r := holdRouter{entered: make(chan struct{}, 1)}
	s, err := New(r, Options{RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	made := fakeTimers(s)
	h := serveServer(t, s)
	e := h.open(t)
	e.send(reqHeaders(false, nil))
	e.send(reqBody(chat("sys", "s1", "hi"), true))
	<-r.entered
	tm := <-made
	if tm.d != 5*time.Second {
		t.Fatalf("timer of %v, want RequestTimeout", tm.d)
	}
	tm.c <- time.Time{}
	// Before the fix nothing ended the Pick: the stream stayed held
	// until the test's own stream deadline (20s) cut it.
	m, err := e.stream.Recv()
	if err != nil {
		t.Fatalf("no answer to the held request at RequestTimeout: %v", err)
	}
	if im := m.GetImmediateResponse(); im == nil || im.GetStatus().GetCode() != 408 {
		t.Fatalf("answer %v, want an immediate 408", m)
	}
	st := waitStats(t, s, "the stream to end", func(st Stats) bool { return st.Streams == 0 })
	if st.RequestTimeouts != 1 || st.ReservedBytes != 0 {
		t.Fatalf("stats %+v, want one request timeout and nothing reserved", st)
	}
}
