package kvevents

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDefaultTokenizeBytesAsDocumented: DefaultTokenizeBytes' comment
// says how many calls the default budget holds at once, of the longest
// prompt the gateway accepts (an 8 MiB body) and of 10 kB prompts, each
// answered with a 6-digit id per 4 bytes of prompt (1.75 times it, as
// TestMeasureTokenizeMemory and docs/gateway.md): one call must then fit
// in a budget of DefaultTokenizeBytes divided by that number. (The
// commit said 18 and 9,000: one call needs 30.0 MiB and 37.5 kB.)
func TestDefaultTokenizeBytesAsDocumented(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := io.ReadAll(r.Body)
		var ans bytes.Buffer
		ans.WriteString(`{"count":0,"tokens":[`)
		for i := range (len(in) - 25) / 4 {
			if i > 0 {
				ans.WriteByte(',')
			}
			ans.WriteString(strconv.Itoa(100000 + i%900000))
		}
		ans.WriteString(`]}`)
		w.Header().Set("Content-Length", strconv.Itoa(ans.Len()))
		_, _ = w.Write(ans.Bytes())
	}))
	defer srv.Close()
	base := func(string) (string, error) { return srv.URL, nil }
	for _, tc := range []struct {
		calls  int64
		prompt int // bytes
	}{
		{8, 8<<20 - len(`{"model":"m","prompt":""}`)}, // the longest an 8 MiB request body holds
		{7000, 10_000},
	} {
		t.Run(fmt.Sprintf("%d calls of %d bytes", tc.calls, tc.prompt), func(t *testing.T) {
			tok := NewHTTPTokenizer(srv.Client(), base, DefaultTokenizeBytes/tc.calls)
			toks, err := tok.Tokenize(context.Background(), TokenizeRequest{Model: "m", Prompt: strings.Repeat("abcd", tc.prompt/4)})
			require.NoError(t, err, "one of %d calls at once does not fit in the default budget", tc.calls)
			require.Len(t, toks, tc.prompt/4)
		})
	}
}

// TestTokenizeMalformedAnswerNotOverBudget: an answer whose "tokens"
// array is not of integers (here one string full of commas) is a
// malformed answer: it must fail as one, not be charged 4 bytes per
// comma inside the string (which makes it an over-budget refusal,
// counted in tokenize_over_budget_total, and, when it fits, allocates 4
// times the answer for ids that are never read).
func TestTokenizeMalformedAnswerNotOverBudget(t *testing.T) {
	answer := `{"tokens":["` + strings.Repeat(",", 10_000) + `"]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	req := TokenizeRequest{Model: "m", Prompt: strings.Repeat("x", 1000)}
	// Room for the body, the answer and some ids, not for 10,001.
	tok := NewHTTPTokenizer(srv.Client(), func(string) (string, error) { return srv.URL, nil },
		int64(tokenizeBodySize(req)+len(answer)+1+4*1000))
	_, err := tok.Tokenize(context.Background(), req)
	require.ErrorIs(t, err, ErrTokenize)
	require.NotErrorIs(t, err, ErrOverBudget, "a malformed answer, not a budget refusal: %v", err)
	require.ErrorContains(t, err, "is not an integer")
	require.Zero(t, tok.Budget().OverBudget)
	require.Zero(t, tok.Budget().Used)
}

// TestTokenizeBudgetReleasedOnEveryPath: whatever the engine does (an
// error status, an answer cut short of its Content-Length, one past the
// limit, a context cancelled mid-answer, one without Content-Length, a
// malformed one), the call gives back every byte it reserved.
func TestTokenizeBudgetReleasedOnEveryPath(t *testing.T) {
	ok := `{"tokens":[` + strings.Repeat("7,", 4999) + `7]}`
	stall := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := io.ReadAll(r.Body)
		switch {
		case bytes.Contains(in, []byte("status")):
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, strings.Repeat("e", 4096))
		case bytes.Contains(in, []byte("short")):
			w.Header().Set("Content-Length", strconv.Itoa(len(ok)+100))
			_, _ = io.WriteString(w, ok)
		case bytes.Contains(in, []byte("long")):
			_, _ = io.WriteString(w, `{"tokens":[`+strings.Repeat("1,", 1<<20)+`1]}`)
		case bytes.Contains(in, []byte("stall")):
			w.Header().Set("Content-Length", strconv.Itoa(len(ok)))
			_, _ = io.WriteString(w, ok[:100])
			w.(http.Flusher).Flush()
			<-stall
		case bytes.Contains(in, []byte("chunked")):
			_, _ = io.WriteString(w, ok)
		case bytes.Contains(in, []byte("twice")):
			_, _ = io.WriteString(w, `{"tokens":[1],"tokens":[2]}`)
		default:
			_, _ = io.WriteString(w, `{"tokens":[1,"x"]}`)
		}
	}))
	defer srv.Close()
	defer close(stall) // before srv.Close, which waits for the stalled handler
	tok := NewHTTPTokenizer(srv.Client(), func(string) (string, error) { return srv.URL, nil }, 1<<20)
	for _, p := range []string{"status", "short", "long", "stall", "chunked", "twice", "malformed"} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		toks, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: p})
		cancel()
		if p == "chunked" {
			require.NoError(t, err)
			require.Len(t, toks, 5000)
		} else {
			require.Error(t, err, p)
			require.NotErrorIs(t, err, ErrOverBudget, p)
		}
		require.Zero(t, tok.Budget().Used, p)
	}
	require.Zero(t, tok.Budget().OverBudget)
}
