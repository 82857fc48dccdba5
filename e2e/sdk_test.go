//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"
)

// TestOpenAIGoSDK: the official Go client (openai-go v3) through the
// gateway to llm-d-inference-sim engines: Responses API streamed and not,
// chat and completions, each answered by an engine the gateway names.
func TestOpenAIGoSDK(t *testing.T) {
	c := newCluster(t, "cache_aware")
	var replicas []string
	client := openai.NewClient(option.WithBaseURL(c.gw.url+"/v1"), option.WithAPIKey("unused"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				replicas = append(replicas, resp.Header.Get("X-Exa-Replica"))
			}
			return resp, err
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:        simModel,
		Instructions: openai.String("You are terse."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("Say one word.")},
	})
	require.NoError(t, err)
	require.NotEmpty(t, r.ID)
	require.NotEmpty(t, r.OutputText())

	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: simModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say two words.")},
	})
	events, text := 0, ""
	for stream.Next() {
		ev := stream.Current()
		events++
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
	}
	require.NoError(t, stream.Err())
	require.Greater(t, events, 1)
	require.NotEmpty(t, text)

	cc, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    simModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage("hi")},
	})
	require.NoError(t, err)
	require.NotEmpty(t, cc.Choices)

	co, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(simModel),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
	})
	require.NoError(t, err)
	require.NotEmpty(t, co.Choices)

	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: openai.EmbeddingModel(simModel),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("a sentence to embed")},
	})
	require.NoError(t, err)
	require.NotEmpty(t, emb.Data)

	// A conversation continued with previous_response_id stays on the
	// replica that produced the response it continues (the sims do not
	// store responses, so only the gateway's pin decides).
	prev := r.ID
	for turn := range 3 {
		next, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model:              simModel,
			PreviousResponseID: openai.String(prev),
			Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("and then? " + string(rune('a'+turn)))},
		})
		require.NoError(t, err)
		require.Equal(t, replicas[0], replicas[len(replicas)-1], "turn %d continues on the first answer's replica", turn)
		prev = next.ID
	}

	require.Len(t, replicas, 5+3)
	for i, name := range replicas {
		require.NotEmpty(t, name, "answer %d names the replica that served it", i)
	}
}

// TestOpenAINodeSDK: the official Node client (npm openai 7.59.0, e2e/node)
// through the gateway: responses.create streamed and not, chat,
// completions and embeddings. It installs the package with npm into a
// cache outside the repo; without node and npm it is skipped.
func TestOpenAINodeSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm not found")
	}
	cache := os.Getenv("EXA_E2E_NODE_CACHE")
	if cache == "" {
		home, err := os.UserCacheDir()
		require.NoError(t, err)
		cache = filepath.Join(home, "exa-e2e-node")
	}
	require.NoError(t, os.MkdirAll(cache, 0o755))
	for _, f := range []string{"package.json", "sdk.mjs"} {
		b, err := os.ReadFile(filepath.Join("node", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(cache, f), b, 0o644))
	}
	if _, err := os.Stat(filepath.Join(cache, "node_modules", "openai", "package.json")); err != nil {
		install := exec.Command(npm, "install", "--no-audit", "--no-fund", "--loglevel=error")
		install.Dir = cache
		out, err := install.CombinedOutput()
		require.NoError(t, err, "npm install: %s", out)
	}
	c := newCluster(t, "cache_aware")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, node, "sdk.mjs", c.gw.url+"/v1", simModel)
	run.Dir = cache
	out, err := run.CombinedOutput()
	require.NoError(t, err, "node sdk.mjs: %s", out)
	t.Logf("%s", out)
	for _, call := range []string{"responses.create resp_", "responses.create stream", "chat.completions.create", "completions.create", "embeddings.create"} {
		require.Contains(t, string(out), call)
	}
}
