package fleetpick

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/picker"
)

// TestPropPickerScope: whatever the subset hint, the replicas' health and
// host names, a pick names an endpoint that is healthy, ip:port and in
// the hint, and is refused with 503 exactly when there is none; the
// fallbacks obey the same rule and never repeat the endpoint.
func TestPropPickerScope(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(rt, "replicas")
		addrs := make([]string, n)
		named := make([]bool, n)
		for i := range addrs {
			named[i] = rapid.Bool().Draw(rt, fmt.Sprintf("named%d", i))
			addrs[i] = fmt.Sprintf("http://10.0.0.%d:8000", i+1)
			if named[i] {
				addrs[i] = fmt.Sprintf("http://engine-%d:8000", i)
			}
		}
		s := pickServer(t, gateway.ModeCacheAware, addrs...)
		p, err := New(s, Options{Fallbacks: rapid.IntRange(0, 3).Draw(rt, "fallbacks")})
		require.NoError(t, err)
		healthy := make([]bool, n)
		for i := range healthy {
			healthy[i] = rapid.Bool().Draw(rt, fmt.Sprintf("healthy%d", i))
			if !healthy[i] {
				ep := s.Snapshot().Endpoints[addrs[i]]
				s.Observe(ep, ep.Health.Failure(true))
			}
		}
		var sub picker.Subset
		if rapid.Bool().Draw(rt, "hint") {
			sub = picker.Subset{}
			for i := range n + 1 { // one endpoint nobody serves
				if rapid.Bool().Draw(rt, fmt.Sprintf("in%d", i)) {
					sub = append(sub, fmt.Sprintf("10.0.0.%d:8000", i+1))
				}
			}
		}
		eligible := map[string]bool{}
		for i := range n {
			ep := fmt.Sprintf("10.0.0.%d:8000", i+1)
			if healthy[i] && !named[i] && sub.Allows(ep) {
				eligible[ep] = true
			}
		}
		for q := range 3 {
			body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"question %d"}]}`, testModel, q)
			pk, err := p.Pick(context.Background(), &picker.PickRequest{Method: "POST", Path: "/v1/chat/completions", Body: body, Subset: sub})
			if len(eligible) == 0 {
				var se *picker.StatusError
				require.True(t, errors.As(err, &se), "want a 503, got %v", err)
				require.Equal(t, http.StatusServiceUnavailable, se.Status)
				require.ErrorIs(t, err, picker.ErrNoEndpoint)
				continue
			}
			require.NoError(t, err)
			require.True(t, eligible[pk.Endpoint], "picked %s, eligible %v", pk.Endpoint, eligible)
			for _, fb := range pk.Fallbacks {
				require.True(t, eligible[fb], "fallback %s, eligible %v", fb, eligible)
				require.NotEqual(t, pk.Endpoint, fb)
			}
			require.False(t, hasDup(pk.Fallbacks))
			require.LessOrEqual(t, len(pk.Fallbacks), min(p.opts.Fallbacks, len(eligible)-1))
			pk.Tracker.Done(picker.Outcome{Status: 200})
		}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			require.Zero(t, r.InFlight)
		}
	})
}

func hasDup(s []string) bool {
	c := slices.Clone(s)
	slices.Sort(c)
	return len(slices.Compact(c)) != len(s)
}

// TestPickerConcurrent picks, tracks and finishes requests from many
// goroutines while the configuration is reloaded, stats and metrics are
// read and engines are ejected and readmitted; run under -race. Every
// request's load is released in the end.
func TestPickerConcurrent(t *testing.T) {
	addrs := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"}
	s := pickServer(t, gateway.ModeCacheAware, addrs...)
	p, err := New(s, Options{Fallbacks: 1, ShedAbove: 1000})
	require.NoError(t, err)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // reloads, stats, health flips
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			reps := []config.Replica{{Name: "r0", Address: addrs[0]}, {Name: "r1", Address: addrs[1+i%2]}}
			_ = s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}})
			_ = s.Stats()
			s.RefreshGauges()
			ep := s.Snapshot().Endpoints[addrs[0]]
			if i%2 == 0 {
				s.Observe(ep, ep.Health.Failure(true))
			} else {
				s.Observe(ep, ep.Health.Success(true))
				s.Observe(ep, ep.Health.Success(true))
			}
		}
	}()
	var picks sync.WaitGroup
	for w := range 4 {
		picks.Add(1)
		go func() {
			defer picks.Done()
			for i := range 200 {
				body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":"s%d"},{"role":"user","content":"q%d"}]}`, testModel, i%7, w)
				var sub picker.Subset
				if i%3 == 0 {
					sub = picker.Subset{"10.0.0.1:8000", "10.0.0.2:8000"}
				}
				pk, err := p.Pick(context.Background(), &picker.PickRequest{Method: "POST", Path: "/v1/chat/completions", Body: body, Subset: sub,
					Header: picker.Headers{{Name: "x-session-id", Value: fmt.Sprint(w)}}})
				if err != nil {
					require.ErrorIs(t, err, picker.ErrNoEndpoint)
					continue
				}
				if i%2 == 0 {
					pk.Tracker.FirstToken()
				}
				pk.Tracker.Done(picker.Outcome{Status: []int{200, 503, 0}[i%3]})
			}
		}()
	}
	picks.Wait()
	close(stop)
	wg.Wait()
	for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
		require.Zero(t, r.InFlight, "replica %s", r.Name)
	}
}
