//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/picker/pickertest"
)

// TestPickerResponses runs `exa serve picker` over three
// llm-d-inference-sim engines, round-robin, behind pickertest.Envoy, with
// the official Go client (openai-go v3): a Responses API conversation,
// streamed and not, continues on the engine that produced its first
// response although round-robin would move each turn (the sims do not
// store responses, so only the picker's pin decides, learned from the
// answers' heads passing through it); an id the picker never saw is
// routed round-robin.
func TestPickerResponses(t *testing.T) {
	requireBinaries(t)
	cfg := filepath.Join(t.TempDir(), "routing.json")
	args := []string{"serve", "routing", "set", simModel, "--mode", "round_robin"}
	var sims []*sim
	for i := range 3 {
		port := freePort(t)
		s := startSim(t, port, simArgs(port, kvBlocks, prefillPerToken))
		sims = append(sims, s)
		args = append(args, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	exa(t, cfg, args...)
	pp := startPickerProc(t, "picker", cfg)
	for _, s := range sims {
		waitFor(t, 20*time.Second, "picker to admit "+s.url(), func() bool { h, _ := pp.engineHealthy(t, s.url()); return h })
	}
	url := pp.envoy(t, false)
	var served []string
	client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				served = append(served, resp.Header.Get(pickertest.HeaderEndpoint))
			}
			return resp, err
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// turn sends one turn, streamed or not, and returns its response id.
	turn := func(input, prev string, stream bool) string {
		t.Helper()
		p := responses.ResponseNewParams{Model: simModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)}}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		if !stream {
			r, err := client.Responses.New(ctx, p)
			require.NoError(t, err)
			require.NotEmpty(t, r.OutputText())
			return r.ID
		}
		s := client.Responses.NewStreaming(ctx, p)
		id := ""
		for s.Next() {
			if ev := s.Current(); ev.Type == "response.created" {
				id = ev.Response.ID
			}
		}
		require.NoError(t, s.Err())
		return id
	}
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			served = served[:0]
			prev := turn("You are terse. Say one word.", "", stream)
			require.NotEmpty(t, prev)
			for i := range 4 {
				prev = turn(fmt.Sprintf("and then? %d", i), prev, i%2 == 1)
				require.NotEmpty(t, prev)
			}
			require.Len(t, served, 5)
			for i, ep := range served {
				require.NotEmpty(t, ep, "answer %d names its engine", i)
				require.Equal(t, served[0], ep, "turn %d continues on the first answer's engine", i)
			}
		})
	}
	t.Run("unknown id", func(t *testing.T) {
		served = served[:0]
		for range 3 {
			turn("hi", "resp_never_seen", false)
		}
		seen := map[string]bool{}
		for _, ep := range served {
			seen[ep] = true
		}
		require.Len(t, seen, 3, "routed round-robin, not pinned: %v", served)
	})
}
