package kvevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHTTPTokenizer(t *testing.T) {
	var got []map[string]json.RawMessage
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/tokenize", r.URL.Path)
		require.Equal(t, http.MethodPost, r.Method)
		var body map[string]json.RawMessage
		require.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		mu.Lock()
		got = append(got, body)
		mu.Unlock()
		switch string(body["model"]) {
		case `"bad"`:
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"no such model"}}`)
		case `"garbled"`:
			io.WriteString(w, `{"tokens":[1,2,`)
		case `"empty"`:
			io.WriteString(w, `{"count":0}`)
		case `"negative"`:
			io.WriteString(w, `{"tokens":[-1]}`)
		case `"huge"`:
			io.WriteString(w, `{"tokens":[`+strings.Repeat("1,", 1000)+`1]}`)
		case `"flood"`: // 1 MB of token ids for any prompt
			io.WriteString(w, `{"tokens":[`+strings.Repeat("1,", 500_000)+`1]}`)
		default:
			io.WriteString(w, `{"count":3,"max_model_len":8192,"tokens":[5,6,4294967295]}`)
		}
	}))
	defer srv.Close()
	tok := NewHTTPTokenizer(srv.Client(), func(model string) (string, error) {
		if model == "unserved" {
			return "", errors.New("no healthy replica")
		}
		return srv.URL + "/", nil
	}, 0)
	ctx := context.Background()

	toks, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "hello world"})
	require.NoError(t, err)
	require.Equal(t, []uint32{5, 6, 4294967295}, toks)
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	_, err = tok.Tokenize(ctx, TokenizeRequest{Model: "m", Messages: msgs, Tools: tools, ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`)})
	require.NoError(t, err)
	require.Equal(t, map[string]json.RawMessage{"model": json.RawMessage(`"m"`), "prompt": json.RawMessage(`"hello world"`)}, got[0])
	require.JSONEq(t, string(msgs), string(got[1]["messages"]))
	require.JSONEq(t, string(tools), string(got[1]["tools"]))
	require.JSONEq(t, `{"enable_thinking":false}`, string(got[1]["chat_template_kwargs"]))
	require.NotContains(t, got[1], "prompt")

	// An answer out of proportion to the prompt is refused (issue 21:
	// answers up to 64 MiB were accepted for any prompt).
	_, err = tok.Tokenize(ctx, TokenizeRequest{Model: "flood", Prompt: "hi"})
	require.ErrorContains(t, err, fmt.Sprintf("response over %d bytes", tokenizeSlack+2*tokenizeBytesPer))
	toks, err = tok.Tokenize(ctx, TokenizeRequest{Model: "flood", Prompt: strings.Repeat("word ", 20_000)})
	require.NoError(t, err, "a prompt of 100 kB may have 500k tokens")
	require.Len(t, toks, 500_001)

	tok.max = 1000
	for _, tc := range []struct {
		req  TokenizeRequest
		want string
	}{
		{TokenizeRequest{Model: "bad", Prompt: "x"}, `status 400: {"error":{"message":"no such model"}}`},
		{TokenizeRequest{Model: "garbled", Prompt: "x"}, "response: invalid JSON at offset 15: unexpected end of input"},
		{TokenizeRequest{Model: "empty", Prompt: "x"}, `response has no "tokens"`},
		{TokenizeRequest{Model: "negative", Prompt: "x"}, `response: token "-1" is not an integer of 32 bits`},
		{TokenizeRequest{Model: "huge", Prompt: "x"}, "response over 1000 bytes"},
		{TokenizeRequest{Model: "unserved", Prompt: "x"}, `model "unserved": no healthy replica`},
	} {
		_, err := tok.Tokenize(ctx, tc.req)
		require.ErrorIs(t, err, ErrTokenize, tc.req.Model)
		require.ErrorContains(t, err, tc.want)
	}
	for _, tc := range []struct {
		req  TokenizeRequest
		want string
	}{
		{TokenizeRequest{Prompt: "x"}, "empty model"},
		{TokenizeRequest{Model: "m"}, "want exactly one of prompt (0 bytes) and messages (0 bytes)"},
		{TokenizeRequest{Model: "m", Prompt: "x", Messages: msgs}, "want exactly one of prompt (1 bytes) and messages (32 bytes)"},
	} {
		_, err := tok.Tokenize(ctx, tc.req)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestHTTPTokenizerBudget: the calls in flight share one budget; a call
// that does not fit fails at once (before the engine when its request
// body does not fit) with ErrOverBudget, counted, and every call gives
// back what it held.
func TestHTTPTokenizerBudget(t *testing.T) {
	var calls atomic.Int64
	answer := `{"tokens":[` + strings.Repeat("1,", 999) + `1]}` // 2,012 bytes, 1,000 ids
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := io.ReadAll(r.Body)
		calls.Add(1)
		if bytes.Contains(in, []byte(`"hold"`)) {
			<-hold
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	base := func(string) (string, error) { return srv.URL, nil }
	ctx := context.Background()
	body := tokenizeBodySize(TokenizeRequest{Model: "m", Prompt: "x"}) // 26 bytes
	for _, tc := range []struct {
		name   string
		limit  int64
		reach  bool // the call reaches the engine
		served bool
		want   string
	}{
		{"fits", int64(body) + int64(len(answer)) + 1 + 4000, true, true, ""},
		{"ids do not fit", int64(body) + int64(len(answer)) + 1 + 3999, true, false, "1000 token ids: "},
		{"answer does not fit", int64(body) + int64(len(answer)), true, false, "answer: "},
		{"body does not fit", int64(body) - 1, false, false, "request body of 26 bytes: "},
		{"expected answer does not fit", int64(body) + 1, false, false, "the 2 bytes an answer to 26 bytes is expected to need: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := NewHTTPTokenizer(srv.Client(), base, tc.limit)
			before := calls.Load()
			toks, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "x"})
			require.Equal(t, tc.reach, calls.Load() > before)
			b := tok.Budget()
			require.Zero(t, b.Used, "every share given back")
			require.Equal(t, tc.limit, b.Limit)
			if tc.served {
				require.NoError(t, err)
				require.Len(t, toks, 1000)
				require.Zero(t, b.OverBudget)
				return
			}
			require.ErrorIs(t, err, ErrTokenize)
			require.ErrorIs(t, err, ErrOverBudget)
			require.ErrorContains(t, err, tc.want)
			require.EqualValues(t, 1, b.OverBudget)
		})
	}

	// Two calls at once: the second finds the first's share taken.
	tok := NewHTTPTokenizer(srv.Client(), base, int64(body)+int64(len(answer))+1+4000+int64(body))
	done := make(chan error, 1)
	before := calls.Load()
	go func() {
		_, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "hold"})
		done <- err
	}()
	for calls.Load() == before {
		runtime.Gosched()
	}
	used := tok.Budget().Used
	// The second call's body and answer fit beside the first's body, but
	// not its ids.
	_, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "x"})
	close(hold)
	require.NoError(t, <-done)
	require.EqualValues(t, body+3+11, used, "the first call holds its body and the answer expected (11 bytes for 4) while it waits")
	require.ErrorIs(t, err, ErrOverBudget)
	require.ErrorContains(t, err, "1000 token ids: ")
	require.Zero(t, tok.Budget().Used)
	require.EqualValues(t, 1, tok.Budget().OverBudget)
}

// countingTokenizer returns one token per byte of the prompt, counting
// calls; gate, if set, holds each call until closed.
type countingTokenizer struct {
	calls atomic.Int64
	gate  chan struct{}
	fail  bool
}

func (c *countingTokenizer) Tokenize(ctx context.Context, req TokenizeRequest) ([]uint32, error) {
	c.calls.Add(1)
	if c.gate != nil {
		<-c.gate
	}
	if c.fail {
		return nil, fmt.Errorf("engine down")
	}
	out := make([]uint32, 0, len(req.Prompt)+len(req.Messages))
	for _, b := range []byte(req.Prompt + string(req.Messages)) {
		out = append(out, uint32(b))
	}
	return out, nil
}

func TestCachedTokenizer(t *testing.T) {
	inner := &countingTokenizer{}
	now := time.Unix(1000, 0)
	// Room for 20 entries of 10 tokens, each counted with its entryCost.
	c := NewCachedTokenizer(inner, CacheOptions{MaxTokens: 20 * (10 + entryCost), TTL: time.Minute, Now: func() time.Time { return now }})
	ctx := context.Background()
	tok := func(model, prompt string) []uint32 {
		t.Helper()
		out, err := c.Tokenize(ctx, TokenizeRequest{Model: model, Prompt: prompt})
		require.NoError(t, err)
		return out
	}
	a := tok("m", "abc")
	require.Equal(t, []uint32{'a', 'b', 'c'}, a)
	_ = append(a, 'z') // appending to a result does not touch the cache
	require.Equal(t, []uint32{'a', 'b', 'c'}, tok("m", "abc"))
	require.Equal(t, int64(1), inner.calls.Load())
	tok("other-model", "abc")
	_, err := c.Tokenize(ctx, TokenizeRequest{Model: "m", Messages: json.RawMessage(`"abc"`)})
	require.NoError(t, err)
	require.Equal(t, int64(3), inner.calls.Load(), "the model and the kind of input are part of the key")

	now = now.Add(time.Minute)
	tok("m", "abc")
	require.Equal(t, int64(4), inner.calls.Load(), "expired after the TTL")

	tok("m", strings.Repeat("x", 20*(10+entryCost)/16+1)) // over MaxTokens/16: not cached
	tok("m", strings.Repeat("x", 20*(10+entryCost)/16+1))
	require.Equal(t, int64(6), inner.calls.Load())

	for i := range 30 { // 30 entries of 10 tokens: the oldest go
		tok("m", fmt.Sprintf("prompt-%03d", i))
	}
	st := c.Stats()
	require.Equal(t, 200, st.Tokens)
	require.Equal(t, 20, st.Entries)
	calls := inner.calls.Load()
	tok("m", "prompt-029")
	tok("m", "prompt-000")
	require.Equal(t, calls+1, inner.calls.Load(), "recent kept, oldest evicted")

	inner.fail = true
	_, err = c.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "fails"})
	require.Error(t, err)
	inner.fail = false
	tok("m", "fails")
	require.Equal(t, calls+3, inner.calls.Load(), "failures are not cached")
	st = c.Stats()
	require.Equal(t, uint64(2), st.Hits)
}

func TestCachedTokenizerSharesCalls(t *testing.T) {
	inner := &countingTokenizer{gate: make(chan struct{})}
	c := NewCachedTokenizer(inner, CacheOptions{})
	var wg sync.WaitGroup
	results := make([][]uint32, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Tokenize(context.Background(), TokenizeRequest{Model: "m", Prompt: "same"})
			require.NoError(t, err)
			results[i] = r
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); c.Stats().Shared+c.Stats().Misses < 8; {
		require.False(t, time.Now().After(deadline), "callers did not arrive")
		time.Sleep(time.Millisecond) // goroutines of this test, no process: a short poll
	}
	close(inner.gate)
	wg.Wait()
	require.Equal(t, int64(1), inner.calls.Load())
	for _, r := range results {
		require.Equal(t, []uint32{'s', 'a', 'm', 'e'}, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	inner2 := &countingTokenizer{gate: make(chan struct{})}
	c2 := NewCachedTokenizer(inner2, CacheOptions{})
	go c2.Tokenize(context.Background(), TokenizeRequest{Model: "m", Prompt: "x"})
	for c2.Stats().Misses == 0 {
		time.Sleep(time.Millisecond)
	}
	_, err := c2.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: "x"})
	require.ErrorIs(t, err, context.Canceled, "a waiter leaves when its context ends")
	close(inner2.gate)
}

// ctxTokenizer answers one token per prompt byte once gate is closed, or
// fails with its context's error when that context ends first, as
// HTTPTokenizer's request does.
type ctxTokenizer struct {
	calls atomic.Int64
	gate  chan struct{}
}

func (c *ctxTokenizer) Tokenize(ctx context.Context, req TokenizeRequest) ([]uint32, error) {
	c.calls.Add(1)
	select {
	case <-c.gate:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %v", ErrTokenize, ctx.Err()) // as HTTPTokenizer wraps it: %v
	}
	out := make([]uint32, 0, len(req.Prompt))
	for _, b := range []byte(req.Prompt) {
		out = append(out, uint32(b))
	}
	return out, nil
}

// TestCachedTokenizerCallerGoneFailsNoWaiter: when the caller whose call
// the others share goes away (its client disconnects: its context ends),
// that call fails for it alone; a waiter whose own context is live asks
// again rather than failing with the other caller's cancellation (found
// in review: every waiter got "context canceled" and its request was
// keyed without tokens).
func TestCachedTokenizerCallerGoneFailsNoWaiter(t *testing.T) {
	inner := &ctxTokenizer{gate: make(chan struct{})}
	c := NewCachedTokenizer(inner, CacheOptions{})
	req := TokenizeRequest{Model: "m", Prompt: "same"}
	leaderCtx, cancel := context.WithCancel(context.Background())
	leader := make(chan error, 1)
	go func() {
		_, err := c.Tokenize(leaderCtx, req)
		leader <- err
	}()
	for c.Stats().Misses == 0 {
		runtime.Gosched()
	}
	type result struct {
		toks []uint32
		err  error
	}
	waiter := make(chan result, 1)
	go func() {
		toks, err := c.Tokenize(context.Background(), req)
		waiter <- result{toks, err}
	}()
	for c.Stats().Shared == 0 {
		runtime.Gosched()
	}
	cancel()
	require.ErrorIs(t, <-leader, ErrTokenize, "the caller that went away fails")
	for inner.calls.Load() < 2 { // the waiter asks again, or fails
		select {
		case r := <-waiter:
			t.Fatalf("the waiter, its context live, got %v, %v", r.toks, r.err)
		default:
			runtime.Gosched()
		}
	}
	close(inner.gate)
	r := <-waiter
	require.NoError(t, r.err)
	require.Equal(t, []uint32{'s', 'a', 'm', 'e'}, r.toks)
	require.EqualValues(t, 2, inner.calls.Load())
}
