//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
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

// tailSimArgs are simArgs without the engine's KV cache: with it,
// llm-d-inference-sim v0.10.2 fails every request for several choices
// (n > 1), streamed or not, with 500 "request already exists for id"
// (its choices share one request id in its cache), so the n=3 checks
// need engines without it.
func tailSimArgs(port int) []string {
	var out []string
	args := simArgs(port, kvBlocks, prefillPerToken)
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--enable-kvcache":
		case "--kv-cache-size", "--block-size":
			i++
		default:
			out = append(out, args[i])
		}
	}
	return out
}

// openAITail runs the OpenAI API's long tail (issue 30) with the official
// Go client (openai-go v3) against base (a front over round-robin
// engines): embeddings with arrays of strings, of token ids and of arrays
// of token ids; chat and completions with n=3, not streamed; a stored
// response's retrieve and delete, which reach the engine that produced
// it (llm-d-inference-sim answers them 404: it implements neither, nor
// stores responses, so its own 404 is what the client gets, from that
// engine), and an id the front never saw, which it answers itself with
// 404 naming the id.
func openAITail(t *testing.T, base string) {
	var served []string // X-Exa-Replica of each answer
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				served = append(served, resp.Header.Get("X-Exa-Replica"))
			}
			return resp, err
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name  string
		input openai.EmbeddingNewParamsInputUnion
		want  int
	}{
		{"strings", openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "b"}}, 2},
		{"token ids", openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{1, 2, 3}}, 1},
		{"arrays of token ids", openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{{1, 2}, {3}}}, 2},
	} {
		emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: openai.EmbeddingModel(simModel), Input: tc.input})
		require.NoError(t, err, "embeddings of %s", tc.name)
		require.Len(t, emb.Data, tc.want, "embeddings of %s", tc.name)
	}

	cc, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: simModel, N: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("three answers, please")},
	})
	require.NoError(t, err, "chat n=3")
	require.Len(t, cc.Choices, 3)
	for i, ch := range cc.Choices {
		require.EqualValues(t, i, ch.Index)
		require.NotEmpty(t, ch.Message.Content, "choice %d", i)
	}
	co, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model: openai.CompletionNewParamsModel(simModel), N: openai.Int(3),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("three endings")},
	})
	require.NoError(t, err, "completions n=3")
	require.Len(t, co.Choices, 3)

	r, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: simModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("store this one")}})
	require.NoError(t, err)
	owner := served[len(served)-1]
	require.NotEmpty(t, owner)
	var apiErr *openai.Error
	for i := range 3 { // round-robin would move each of them
		_, err = client.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
		require.True(t, errors.As(err, &apiErr), "retrieve %d: %v", i, err)
		require.Equal(t, http.StatusNotFound, apiErr.StatusCode)
		require.NotEqual(t, "response_not_found", apiErr.Code, "the engine's answer, not the front's")
		require.Equal(t, owner, served[len(served)-1], "retrieve %d reached the engine that produced the response", i)
	}
	err = client.Responses.Delete(ctx, r.ID)
	require.True(t, errors.As(err, &apiErr), "delete: %v", err)
	require.Equal(t, owner, served[len(served)-1], "delete reached the engine that produced the response")

	_, err = client.Responses.Get(ctx, "resp_never_seen", responses.ResponseGetParams{})
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, http.StatusNotFound, apiErr.StatusCode)
	require.Equal(t, "response_not_found", apiErr.Code)
	require.Contains(t, apiErr.Message, `"resp_never_seen"`)
	err = client.Responses.Delete(ctx, "resp_never_seen")
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, "response_not_found", apiErr.Code)
}

// TestOpenAITail: the OpenAI API's long tail through the HTTP gateway
// with the official Go client (openAITail), then the Node client's
// (e2e/node/tail.mjs, skipped without node and npm).
func TestOpenAITail(t *testing.T) {
	c := startCluster(t, "round_robin", 3, tailSimArgs)
	c.waitAllHealthy()
	openAITail(t, c.gw.url)
	nodeTail(t, c.gw.url)
}

// TestPickerOpenAITail: the same through `exa serve picker` behind
// pickertest.Envoy.
func TestPickerOpenAITail(t *testing.T) {
	requireBinaries(t)
	cfg := filepath.Join(t.TempDir(), "routing.json")
	args := []string{"serve", "routing", "set", simModel, "--mode", "round_robin"}
	var sims []*sim
	for i := range 3 {
		port := freePort(t)
		s := startSim(t, port, tailSimArgs(port))
		sims = append(sims, s)
		args = append(args, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	exa(t, cfg, args...)
	pp := startPickerProc(t, "picker", cfg)
	for _, s := range sims {
		waitFor(t, 20*time.Second, "picker to admit "+s.url(), func() bool { h, _ := pp.engineHealthy(t, s.url()); return h })
	}
	url := pp.envoy(t, false)
	openAITail(t, url)
	nodeTail(t, url)
}

// nodeTail runs e2e/node/tail.mjs (the official Node client, npm openai
// 7.59.0) against base: the same checks as openAITail.
func nodeTail(t *testing.T, base string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Log("node not found: the Node client's checks skipped")
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Log("npm not found: the Node client's checks skipped")
		return
	}
	cache := os.Getenv("EXA_E2E_NODE_CACHE")
	if cache == "" {
		home, err := os.UserCacheDir()
		require.NoError(t, err)
		cache = filepath.Join(home, "exa-e2e-node")
	}
	require.NoError(t, os.MkdirAll(cache, 0o755))
	for _, f := range []string{"package.json", "tail.mjs"} {
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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, node, "tail.mjs", base+"/v1", simModel)
	run.Dir = cache
	out, err := run.CombinedOutput()
	require.NoError(t, err, "node tail.mjs: %s", out)
	t.Logf("%s", out)
	lines := []string{"embeddings strings 2", "embeddings tokens 1", "embeddings token arrays 2", "chat n=3 3", "completions n=3 3",
		"retrieve engine 404", "delete engine 404", "retrieve unknown 404 response_not_found"}
	for _, l := range lines {
		require.Contains(t, string(out), l)
	}
}
