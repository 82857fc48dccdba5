package kvevents

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/examlops/gateway/internal/memtest"
)

// TestMeasureTokenizeMemory: EXA_CALLS (64) tokenizations of an
// EXA_PROMPT_MIB (7) MiB prompt at once, each answered with a token of 6
// digits for every 4 bytes of the prompt (a /tokenize answer of 1.75
// times the prompt), the engine holding its answers until every call has
// reached it or been refused. It prints the peak live heap and the
// process's peak RSS, and how many calls were served and refused: the
// figures of docs/security.md ("Memory budgets").
//
//	EXA_MEASURE_MEMORY=1 go test ./kvevents -run TestMeasureTokenizeMemory -count=1 -v
//
// EXA_BUDGET_MIB sets the tokenizer's budget (DefaultTokenizeBytes).
// The answers carry their Content-Length, as vLLM's and
// llm-d-inference-sim's do; EXA_CHUNKED=1 sends them without.
func TestMeasureTokenizeMemory(t *testing.T) {
	if testing.Short() || memtest.EnvInt(t, "EXA_MEASURE_MEMORY", 0) == 0 {
		t.Skip("set EXA_MEASURE_MEMORY=1 to measure")
	}
	calls := memtest.EnvInt(t, "EXA_CALLS", 64)
	chunked := memtest.EnvInt(t, "EXA_CHUNKED", 0) != 0
	prompt := strings.Repeat("abcd", memtest.EnvInt(t, "EXA_PROMPT_MIB", 7)<<20/4)
	// One answer, made before the measurement, served to every call.
	var ans bytes.Buffer
	ans.WriteString(`{"count":0,"tokens":[`)
	for i := range len(prompt) / 4 {
		if i > 0 {
			ans.WriteByte(',')
		}
		ans.WriteString(strconv.Itoa(100000 + i%900000))
	}
	ans.WriteString(`]}`)
	answer := ans.Bytes()

	var reached, refused atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	check := func() {
		if reached.Load()+refused.Load() >= int64(calls) {
			once.Do(func() { close(release) })
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		reached.Add(1)
		check()
		<-release
		w.Header().Set("Content-Type", "application/json")
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		}
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	// The transport marks the calls that reach the engine.
	inner := srv.Client().Transport
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Context().Value(sentKey{}).(*atomic.Bool).Store(true)
		return inner.RoundTrip(r)
	})}
	tok := newMeasuredTokenizer(t, client, func(string) (string, error) { return srv.URL, nil })

	var served, failed atomic.Int64
	var firstErr atomic.Value
	heap := memtest.PeakHeap(func() {
		rss := memtest.PeakRSS(func() {
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					var sent atomic.Bool
					ctx := context.WithValue(context.Background(), sentKey{}, &sent)
					toks, err := tok.Tokenize(ctx, TokenizeRequest{Model: "m", Prompt: prompt})
					if err != nil {
						firstErr.CompareAndSwap(nil, err.Error())
						failed.Add(1)
						if !sent.Load() {
							refused.Add(1)
							check()
						}
						return
					}
					if len(toks) != len(prompt)/4 {
						t.Errorf("%d tokens, want %d", len(toks), len(prompt)/4)
					}
					served.Add(1)
				})
			}
			wg.Wait()
		})
		t.Logf("peak RSS +%.0f MiB", float64(rss)/(1<<20))
	})
	t.Logf("%d calls of a %.0f MiB prompt (answers of %.1f MiB): %d served, %d failed (%d before reaching the engine); peak heap +%.0f MiB",
		calls, float64(len(prompt))/(1<<20), float64(len(answer))/(1<<20), served.Load(), failed.Load(), refused.Load(), float64(heap)/(1<<20))
	if e := firstErr.Load(); e != nil {
		t.Logf("first error: %v", e)
	}
}

type sentKey struct{}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func newMeasuredTokenizer(t *testing.T, c *http.Client, base func(string) (string, error)) Tokenizer {
	return NewHTTPTokenizer(c, base, int64(memtest.EnvInt(t, "EXA_BUDGET_MIB", DefaultTokenizeBytes>>20))<<20)
}
