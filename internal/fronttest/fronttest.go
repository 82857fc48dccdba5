// Package fronttest holds the test fixtures that the HTTP gateway's and
// the endpoint picker's tests share (packages httpgw and
// picker/fleetpick): an in-process tokenizer, KV-event frames as vLLM
// sends them, loopback addresses, metric readers (metrics.go), the
// scenarios both fronts run (firsttoken.go) and the checks of an
// assembled answer (assembled.go). For tests only.
package fronttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/testport"
	"github.com/examlops/gateway/kvevents"
)

// WordTokenizer is an in-process tokenizer: one token per word of the
// prompt, or of the messages' contents joined; a prompt starting "fail"
// fails. Safe for concurrent use; the zero value is ready.
type WordTokenizer struct {
	mu    sync.Mutex
	calls int
}

// WordTokens returns text's tokens as WordTokenizer makes them.
func WordTokens(text string) []uint32 {
	var out []uint32
	for _, w := range strings.Fields(text) {
		h := fnv.New32a()
		h.Write([]byte(w))
		out = append(out, h.Sum32())
	}
	return out
}

// Tokenize implements kvevents.Tokenizer.
func (w *WordTokenizer) Tokenize(_ context.Context, req kvevents.TokenizeRequest) ([]uint32, error) {
	w.mu.Lock()
	w.calls++
	w.mu.Unlock()
	text := req.Prompt
	if len(req.Messages) > 0 {
		var msgs []struct{ Content string }
		if err := json.Unmarshal(req.Messages, &msgs); err != nil {
			return nil, err
		}
		for _, m := range msgs {
			text += " " + m.Content
		}
	}
	if strings.HasPrefix(text, "fail") {
		return nil, errors.New("tokenizer down")
	}
	return WordTokens(text), nil
}

// Calls is how many times Tokenize was called.
func (w *WordTokenizer) Calls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}

// EventFrames encodes one message of events (array encoding), as vLLM
// publishes it: topic, sequence number, payload.
func EventFrames(t testing.TB, topic string, seq uint64, events ...[]any) [][]byte {
	t.Helper()
	evs := make([]any, len(events))
	for i, e := range events {
		evs[i] = e
	}
	payload, err := msgpack.Marshal([]any{1.5, evs, 0})
	require.NoError(t, err)
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte(topic), s[:], payload}
}

// StoredEvent is a BlockStored event of blocks of bs tokens.
func StoredEvent(hashes []uint64, parent any, tokens []uint32, bs int) []any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return []any{"BlockStored", hs, parent, tokens, bs, nil, "GPU", nil}
}

// FreeTCP returns a tcp:// loopback endpoint free when it was asked for.
func FreeTCP(t testing.TB) string {
	t.Helper()
	return "tcp://" + testport.Addr(t)
}

// Words returns n words: prefix0 prefix1 ...
func Words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}

// FrontBodies are requests as users send them, each to its path: plain
// text, content as parts, several system messages, tools, chat template
// arguments, images, a completions prompt, and Responses API input.
var FrontBodies = []struct {
	Path, Body, Session string
}{
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}`, ""},
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"system","content":"You are terse."},{"role":"system","content":"Answer in French."},{"role":"user","content":"hi"}]}`, "s1"},
	{"/v1/chat/completions", `{"model":"m1","messages":[{"role":"developer","content":[{"type":"text","text":"You are terse."}]},{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, ""},
	{"/v1/chat/completions", `{"model":"m1","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"call f"},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"tool","content":"{\"ok\":true}"}]}`, "s1"},
	{"/v1/chat/completions", `{"model":"m1","chat_template_kwargs":{"enable_thinking":false},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"call f"}]}`, "s1"},
	{"/v1/chat/completions", `{"model":"m1","user":"u7","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}]}`, ""},
	{"/v1/completions", `{"model":"m1","prompt":["You are terse.","hi"]}`, ""},
	{"/v1/completions", `{"model":"m1","prompt":[1,2,3,4]}`, ""},
	{"/v1/responses", `{"model":"m1","instructions":"You are terse.","input":"hi"}`, ""},
	{"/v1/responses", `{"model":"m1","instructions":"You are terse.","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","name":"f","arguments":"{}"}]}`, "s2"},
	{"/v1/responses", `{"model":"m1","input":"hi","previous_response_id":"resp_1"}`, ""},
}

// Post sends a JSON POST of body to base+path with the header pairs hdr
// (name, value, ...) and returns the answer.
func Post(t testing.TB, base, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// ReadAll reads and closes resp's body.
func ReadAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// DecodeError decodes an OpenAI error answer.
func DecodeError(t testing.TB, b []byte) front.APIError {
	t.Helper()
	var eb front.ErrorBody
	require.NoError(t, json.NewDecoder(bytes.NewReader(b)).Decode(&eb), "body %s", b)
	return eb.Error
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes and reads: a
// log sink, or a process's output, that a test reads while it is written.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// DoneRecorder is a round-robin policy that records what each Done told
// the library (a gateway.Observer), for the fronts' tests. Safe for
// concurrent use.
type DoneRecorder struct {
	gateway.RoundRobin
	mu    sync.Mutex
	infos []gateway.DoneInfo
}

func (r *DoneRecorder) Routed(uint64, string) {}
func (r *DoneRecorder) FirstToken(uint64)     {}
func (r *DoneRecorder) Done(_ uint64, info gateway.DoneInfo) {
	r.mu.Lock()
	r.infos = append(r.infos, info)
	r.mu.Unlock()
}

// Last returns the last DoneInfo recorded; the test fails if none was.
func (r *DoneRecorder) Last(t *testing.T) gateway.DoneInfo {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.infos)
	return r.infos[len(r.infos)-1]
}
