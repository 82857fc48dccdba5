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
	"sync/atomic"

	"github.com/examlops/gateway/internal/budget"
)

// Tokenizer turns a request's prompt into the token ids its engine will
// compute, so the request can be keyed (keys.AppendExact) as the engine's events
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

// expectedAnswer is what HTTPTokenizer reserves for req's answer and its
// token ids before it asks: 2.75 bytes per byte of the prompt, messages,
// tools and template arguments, an answer of 1.75 (a 6-digit id and its
// comma per 4 bytes of text, about what English takes) and ids of 1, at
// most what the longest answer accepted (limit bytes) and its ids could
// need.
func expectedAnswer(req TokenizeRequest, limit int64) int64 {
	return min(req.textBytes()*11/4, (limit+1)*3)
}

// textBytes is the length of req's text: its prompt, messages, tools and
// template arguments.
func (r TokenizeRequest) textBytes() int64 {
	return int64(len(r.Prompt) + len(r.Messages) + len(r.Tools) + len(r.ChatTemplateKwargs))
}

// tokenizeLimit is the largest /tokenize response accepted for req.
func tokenizeLimit(req TokenizeRequest, max int64) int64 {
	return min(max, tokenizeSlack+tokenizeBytesPer*req.textBytes())
}

// DefaultTokenizeBytes is HTTPTokenizer's default budget: 256 MiB for
// all the /tokenize calls in flight together (their request bodies,
// answers and token ids), which holds 8 calls of the longest prompt the
// gateway accepts (an 8 MiB body) at once, or some 7,000 of 10 kB prompts,
// when each is answered with 1.75 times its prompt (a 6-digit id per 4
// bytes): some 30 MiB and 37.5 kB a call, body, answer and ids.
const DefaultTokenizeBytes = 256 << 20

// HTTPTokenizer asks an engine's vLLM-compatible POST /tokenize endpoint
// (vLLM's entrypoints/openai: TokenizeCompletionRequest {model, prompt},
// TokenizeChatRequest {model, messages, tools, chat_template_kwargs};
// llm-d-inference-sim serves the same), with each request's defaults, which
// are those of the completion and chat endpoints: special tokens added to
// a prompt, the generation prompt appended to messages.
//
// The memory of all its calls in flight is bounded together: each call
// reserves its request body, its answer and the token ids it decodes
// from one budget before it allocates them, and a call that does not fit
// fails with an error wrapping ErrTokenize and ErrOverBudget (the
// gateway then keys the request without tokens, FallbackTokenize).
type HTTPTokenizer struct {
	client     *http.Client
	baseURL    func(model string) (string, error)
	max        int64
	budget     *budget.Budget
	overBudget atomic.Uint64
}

var _ Tokenizer = (*HTTPTokenizer)(nil)

// ErrOverBudget is wrapped by the error of a call that HTTPTokenizer's
// budget cannot hold.
var ErrOverBudget = budget.ErrSpent

// NewHTTPTokenizer returns a tokenizer that posts to baseURL(model) +
// "/tokenize"; baseURL should name a healthy replica serving the model
// (http://host:port). A nil client means http.DefaultClient. maxBytes is
// the budget of all its calls in flight; 0 or less means
// DefaultTokenizeBytes.
func NewHTTPTokenizer(client *http.Client, baseURL func(model string) (string, error), maxBytes int64) *HTTPTokenizer {
	if client == nil {
		client = http.DefaultClient
	}
	if maxBytes <= 0 {
		maxBytes = DefaultTokenizeBytes
	}
	return &HTTPTokenizer{client: client, baseURL: baseURL, max: DefaultMaxTokenizeResponse, budget: budget.New(maxBytes)}
}

// TokenizerBudget is what an HTTPTokenizer's budget holds now.
type TokenizerBudget struct {
	// Limit and Used are the budget and the bytes its calls in flight
	// hold now.
	Limit, Used int64
	// OverBudget counts the calls refused because the budget could not
	// hold them.
	OverBudget uint64
}

// Budget reports the tokenizer's budget.
func (t *HTTPTokenizer) Budget() TokenizerBudget {
	return TokenizerBudget{Limit: t.budget.Limit(), Used: t.budget.Used(), OverBudget: t.overBudget.Load()}
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
	url := strings.TrimSuffix(base, "/") + "/tokenize"
	// Three shares of the budget, each charged before it is allocated:
	// the request body, the answer, the token ids.
	// Two shares of the budget, each charged before what it holds is
	// allocated: the request body, and the answer with the token ids
	// decoded from it. The second is reserved up front at what a typical
	// answer needs (expectedAnswer), so that a call the budget cannot
	// hold is refused before it costs an engine anything; it grows if
	// the answer needs more.
	var body, answer budget.Hold
	body.B, answer.B = t.budget, t.budget
	defer body.Release()
	defer answer.Release()
	limit := tokenizeLimit(req, t.max)
	size := tokenizeBodySize(req)
	expect := expectedAnswer(req, limit)
	if err := body.Need(int64(size)); err != nil {
		t.overBudget.Add(1)
		return nil, fmt.Errorf("%w: %s: request body of %d bytes: %w", ErrTokenize, url, size, err)
	}
	if err := answer.Need(expect); err != nil {
		t.overBudget.Add(1)
		return nil, fmt.Errorf("%w: %s: the %d bytes an answer to %d bytes is expected to need: %w", ErrTokenize, url, expect, size, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(appendTokenizeBody(make([]byte, 0, size), req)))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenize, url, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenize, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%w: %s: status %d: %s", ErrTokenize, url, resp.StatusCode, bytes.TrimSpace(msg))
	}
	b, err := answer.ReadAllSize(resp.Body, resp.ContentLength, limit, 1)
	if err != nil {
		if errors.Is(err, budget.ErrSpent) {
			t.overBudget.Add(1)
			return nil, fmt.Errorf("%w: %s: answer: %w", ErrTokenize, url, err)
		}
		if errors.Is(err, budget.ErrTooLong) {
			return nil, fmt.Errorf("%w: %s: response over %d bytes", ErrTokenize, url, limit)
		}
		return nil, fmt.Errorf("%w: %s: response: %v", ErrTokenize, url, err)
	}
	toks, err := decodeTokens(b, func(n int) error { return answer.Need(int64(cap(b)) + 4*int64(n)) })
	if err != nil {
		if errors.Is(err, budget.ErrSpent) {
			t.overBudget.Add(1)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrTokenize, url, err)
	}
	return toks, nil
}
