package front_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// TestFrontsKeyAlike: the fronts' key (Keyer.Key, which the HTTP gateway
// and the picker's Router both call) and the endpoint picker's own key
// function (picker.BodyKey) are equal on every body, and two gateways fed
// each one's keys make the same decisions.
func TestFrontsKeyAlike(t *testing.T) {
	fl, err := fleet.New(fleet.Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, fl.Apply(&config.File{Version: 1, Models: map[string]config.Model{"m1": {Mode: gateway.ModeCacheAware,
		Replicas: []config.Replica{{Name: "r0", Address: "http://10.0.0.1:8000"}}}}}))
	m, err := front.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	k, err := front.NewKeyer(front.KeyerOptions{Fleet: fl, Metrics: m})
	require.NoError(t, err)
	ms := fl.Snapshot().Models["m1"]
	bodyKey, err := picker.BodyKey(keys.TextBlockBytes, "m1")
	require.NoError(t, err)
	newGW := func() *gateway.Gateway {
		g, err := gateway.New([]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}}, gateway.WithMode(gateway.ModeCacheAware))
		require.NoError(t, err)
		return g
	}
	viaGateway, viaPicker := newGW(), newGW()
	endpoints := map[string]keys.Endpoint{"/v1/chat/completions": keys.Chat, "/v1/completions": keys.Completions, "/v1/responses": keys.Responses}
	for round := range 3 {
		for i, b := range fronttest.FrontBodies {
			name := fmt.Sprintf("round %d body %d (%s)", round, i, b.Path)
			var phdr picker.Headers
			if b.Session != "" {
				phdr = picker.Headers{{Name: "x-session-id", Value: b.Session}}
			}
			req, err := front.Parse(endpoints[b.Path], []byte(b.Body))
			require.NoError(t, err, name)
			kg, fb := k.Key(t.Context(), nil, ms, front.Input{Kind: endpoints[b.Path], Body: []byte(b.Body), Req: req, Session: b.Session})
			require.Equal(t, -1, fb, name)
			kp, err := bodyKey(nil, &picker.PickRequest{Method: http.MethodPost, Path: b.Path, Header: phdr, Body: []byte(b.Body)})
			require.NoError(t, err, name)
			require.Equal(t, kg, kp, name)

			dg, err := viaGateway.Route(kg)
			require.NoError(t, err)
			dp, err := viaPicker.Route(kp)
			require.NoError(t, err)
			require.Equal(t, [4]any{dg.Replica, dg.Kind, dg.Matched, dg.Blocks}, [4]any{dp.Replica, dp.Kind, dp.Matched, dp.Blocks}, name)
			dg.Done(gateway.DoneInfo{})
			dp.Done(gateway.DoneInfo{})
		}
	}
}
