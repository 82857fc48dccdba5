//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTurn sends one non-streamed chat request and returns the answer and
// the engine's count of cached prompt tokens.
func chatTurn(t *testing.T, url, session string, msgs []chatMsg) (answer string, cached, prompt int) {
	body, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": 24, "messages": msgs, "user": session})
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	}
	var out struct {
		Choices []struct {
			Message chatMsg `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.NotEmpty(t, out.Choices)
	return out.Choices[0].Message.Content, out.Usage.Details.CachedTokens, out.Usage.PromptTokens
}

// TestMultiTurnSessions runs multi-turn chats (each turn resends the whole
// conversation, as chat clients do) through the gateway in both modes.
// Cache-aware routing keeps a conversation on the engine that holds its
// earlier turns, so later turns find them cached; round-robin scatters
// them.
func TestMultiTurnSessions(t *testing.T) {
	const sessions, turns = 24, 5
	// At most 6 requests run at once on an engine: a session's last turn
	// takes about 28 blocks of 16 tokens, so 6 fit in the 192-block cache.
	// llm-d-inference-sim fails a request whose blocks do not fit beside
	// the running ones' (vLLM would queue it), which round-robin's uneven
	// spread of the 24 concurrent sessions did in 1 of 10 runs.
	c := startCluster(t, "round_robin", engines, func(port int) []string {
		return setArg(simArgs(port, kvBlocks, prefillPerToken), "--max-num-seqs", "6")
	})
	c.waitAllHealthy()
	cachedShare := map[string]float64{}
	for i, mode := range []string{"round_robin", "cache_aware"} {
		if i > 0 {
			c.restartEngines()
			c.setMode(mode)
		}
		rng := rand.New(rand.NewPCG(9, 9))
		system := "You are a support agent for product " + fmt.Sprint(rng.IntN(100)) + ". Be brief."
		var mu sync.Mutex
		var cached, prompt int
		var wg sync.WaitGroup
		for s := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				words := make([]string, 60)
				for i := range words {
					words[i] = fmt.Sprintf("s%dw%d", s, i)
				}
				msgs := []chatMsg{{"system", system}}
				for turn := range turns {
					msgs = append(msgs, chatMsg{"user", fmt.Sprintf("Turn %d of session %d: %s", turn, s, strings.Join(words, " "))})
					answer, c1, p1 := chatTurn(t, c.gw.url, fmt.Sprintf("session-%d", s), msgs)
					msgs = append(msgs, chatMsg{"assistant", answer})
					if turn > 0 {
						mu.Lock()
						cached, prompt = cached+c1, prompt+p1
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		cachedShare[mode] = float64(cached) / float64(prompt)
		t.Logf("%-11s turns 2..%d: %d of %d prompt tokens cached (%.1f%%)", mode, turns, cached, prompt, 100*cachedShare[mode])
	}
	assert.Greater(t, cachedShare["cache_aware"], cachedShare["round_robin"]+0.2,
		"cache-aware keeps conversations on the engine holding their earlier turns")
}

// setArg returns args with flag's value set to v (args holds flag once).
func setArg(args []string, flag, v string) []string {
	out := slices.Clone(args)
	for i := range out[:len(out)-1] {
		if out[i] == flag {
			out[i+1] = v
			return out
		}
	}
	return append(out, flag, v)
}
