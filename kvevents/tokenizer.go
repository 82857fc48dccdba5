package kvevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Tokenizer turns a request's prompt into the token ids its engine will
// compute, so the request can be keyed (AppendKey) as the engine's events
// are. The engine applies its own chat template, which is why the default
// asks the engine itself (HTTPTokenizer); embedders with an in-process
// tokenizer that reproduces the engine's exactly may supply their own.
// Implementations must be safe for concurrent use.
type Tokenizer interface {
	Tokenize(ctx context.Context, req TokenizeRequest) ([]uint32, error)
}

// TokenizeRequest is the part of an OpenAI-style request that decides its
// prompt tokens. Exactly one of Prompt and Messages is set.
type TokenizeRequest struct {
	// Model is the request's model.
	Model string
	// Prompt is a completion request's prompt (a single string; a prompt
	// of token ids needs no tokenizer).
	Prompt string
	// Messages is a chat request's messages array, verbatim JSON.
	Messages json.RawMessage
	// Tools and ChatTemplateKwargs are a chat request's tools and
	// chat_template_kwargs, verbatim JSON, when present: the chat template
	// renders them into the prompt.
	Tools, ChatTemplateKwargs json.RawMessage
}

func (r TokenizeRequest) validate() error {
	switch {
	case r.Model == "":
		return fmt.Errorf("kvevents: tokenize: empty model")
	case (r.Prompt == "") == (len(r.Messages) == 0):
		return fmt.Errorf("kvevents: tokenize: want exactly one of prompt (%d bytes) and messages (%d bytes)", len(r.Prompt), len(r.Messages))
	}
	return nil
}

// ErrTokenize wraps the failures of HTTPTokenizer.
var ErrTokenize = errors.New("kvevents: tokenize")

// DefaultMaxTokenizeResponse bounds a /tokenize response: 16 MiB, some
// 2M token ids, more than any context. A response is also bounded by its
// request (tokenizeLimit).
const DefaultMaxTokenizeResponse = 16 << 20

// A prompt's tokens each cover at least one byte of its text (byte-level
// BPE, or byte fallback), and a token id takes at most 11 bytes of JSON
// ("4294967295,"); the chat template adds a bounded number of tokens.
// So a /tokenize response is bounded by tokenizeBytesPer bytes per byte
// of the request's prompt, messages, tools and template arguments, plus
// tokenizeSlack for the template's tokens and the response's other
// fields, and DefaultMaxTokenizeResponse regardless.
const (
	tokenizeBytesPer = 12
	tokenizeSlack    = 256 << 10
)

// tokenizeLimit is the largest /tokenize response accepted for req.
func tokenizeLimit(req TokenizeRequest, max int64) int64 {
	in := int64(len(req.Prompt) + len(req.Messages) + len(req.Tools) + len(req.ChatTemplateKwargs))
	return min(max, tokenizeSlack+tokenizeBytesPer*in)
}

// HTTPTokenizer asks an engine's vLLM-compatible POST /tokenize endpoint
// (vLLM's entrypoints/openai: TokenizeCompletionRequest {model, prompt},
// TokenizeChatRequest {model, messages, tools, chat_template_kwargs};
// llm-d-inference-sim serves the same), with each request's defaults, which
// are those of the completion and chat endpoints: special tokens added to
// a prompt, the generation prompt appended to messages.
type HTTPTokenizer struct {
	client  *http.Client
	baseURL func(model string) (string, error)
	max     int64
}

var _ Tokenizer = (*HTTPTokenizer)(nil)

// NewHTTPTokenizer returns a tokenizer that posts to baseURL(model) +
// "/tokenize"; baseURL should name a healthy replica serving the model
// (http://host:port). A nil client means http.DefaultClient.
func NewHTTPTokenizer(client *http.Client, baseURL func(model string) (string, error)) *HTTPTokenizer {
	if client == nil {
		client = http.DefaultClient
	}
	return &HTTPTokenizer{client: client, baseURL: baseURL, max: DefaultMaxTokenizeResponse}
}

type tokenizeBody struct {
	Model              string          `json:"model"`
	Prompt             string          `json:"prompt,omitempty"`
	Messages           json.RawMessage `json:"messages,omitempty"`
	Tools              json.RawMessage `json:"tools,omitempty"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

// Tokenize implements Tokenizer.
func (t *HTTPTokenizer) Tokenize(ctx context.Context, req TokenizeRequest) ([]uint32, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	base, err := t.baseURL(req.Model)
	if err != nil {
		return nil, fmt.Errorf("%w: model %q: %v", ErrTokenize, req.Model, err)
	}
	body, err := json.Marshal(tokenizeBody(req))
	if err != nil {
		return nil, fmt.Errorf("%w: model %q: %v", ErrTokenize, req.Model, err)
	}
	url := strings.TrimSuffix(base, "/") + "/tokenize"
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenize, url, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenize, url, err)
	}
	defer resp.Body.Close()
	limit := tokenizeLimit(req, t.max)
	lr := &io.LimitedReader{R: resp.Body, N: limit + 1}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(lr, 512))
		return nil, fmt.Errorf("%w: %s: status %d: %s", ErrTokenize, url, resp.StatusCode, bytes.TrimSpace(msg))
	}
	toks, err := decodeTokens(lr, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenize, url, err)
	}
	return toks, nil
}

// decodeTokens reads a /tokenize answer, {"tokens": [...]}, from lr,
// which limits it to max+1 bytes: an answer that does not parse, has no
// "tokens", or is longer than max bytes is an error.
func decodeTokens(lr *io.LimitedReader, max int64) ([]uint32, error) {
	var out struct {
		Tokens *[]uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(lr).Decode(&out); err != nil {
		if lr.N <= 0 {
			return nil, fmt.Errorf("response over %d bytes", max)
		}
		return nil, fmt.Errorf("response: %v", err)
	}
	if out.Tokens == nil {
		return nil, errors.New(`response has no "tokens"`)
	}
	return *out.Tokens, nil
}
