package httpgw

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func keyOf(t require.TestingT, kind endpointKind, body string, hdr http.Header) gateway.Key {
	req, err := parseRequest(kind, []byte(body))
	require.NoError(t, err)
	h, err := keys.NewHasher(keys.TextBlockBytes)
	require.NoError(t, err)
	if hdr == nil {
		hdr = http.Header{}
	}
	return appendKey(h, nil, req, hdr)
}

func isPrefix(a, b gateway.Key) bool {
	return len(a) <= len(b) && slicesEqual(a, b[:len(a)])
}

func slicesEqual(a, b gateway.Key) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name  string
		kind  endpointKind
		body  string
		field string
	}{
		{"malformed", endpointChat, `{"model":`, ""},
		{"not an object", endpointChat, `[1,2]`, ""},
		{"missing model", endpointChat, `{"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"empty model", endpointChat, `{"model":"","messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"model not a string", endpointChat, `{"model":7,"messages":[]}`, ""},
		{"model not a string names it", endpointChat, `{"model":true,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"null model", endpointChat, `{"model":null,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"user not a string", endpointChat, `{"model":"m","user":1,"messages":[{"role":"user","content":"hi"}]}`, "user"},
		{"missing messages", endpointChat, `{"model":"m"}`, "messages"},
		{"empty messages", endpointChat, `{"model":"m","messages":[]}`, "messages"},
		{"missing prompt", endpointCompletions, `{"model":"m"}`, "prompt"},
		{"null prompt", endpointCompletions, `{"model":"m","prompt":null}`, "prompt"},
		{"stream not bool", endpointChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRequest(tt.kind, []byte(tt.body))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadRequest))
			var re *front.RequestError
			if tt.field != "" {
				require.True(t, errors.As(err, &re))
				assert.Equal(t, tt.field, re.Field)
				assert.Contains(t, err.Error(), tt.field)
			}
		})
	}
}

func TestKeyMapping(t *testing.T) {
	sys := "You are a careful assistant. Answer briefly and cite the documents you were given."
	base := func(extra string) string {
		return `{"model":"m","messages":[{"role":"system","content":` + q(sys) + `}` + extra + `]}`
	}
	sysOnly := keyOf(t, endpointChat, base(""), nil)
	require.NotEmpty(t, sysOnly)

	t.Run("conversation extends the system prefix", func(t *testing.T) {
		k := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello"}`), nil)
		assert.True(t, isPrefix(sysOnly, k))
		assert.Greater(t, len(k), len(sysOnly))
	})
	t.Run("system messages come first wherever they are", func(t *testing.T) {
		a := keyOf(t, endpointChat, `{"model":"m","messages":[{"role":"user","content":"hello"},{"role":"system","content":`+q(sys)+`}]}`, nil)
		assert.True(t, isPrefix(sysOnly, a))
	})
	t.Run("developer role counts as system", func(t *testing.T) {
		a := keyOf(t, endpointChat, `{"model":"m","messages":[{"role":"developer","content":`+q(sys)+`}]}`, nil)
		assert.Equal(t, sysOnly, a)
	})
	t.Run("session follows the system prompt", func(t *testing.T) {
		a := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello"}`), hdr(HeaderSessionID, "s1"))
		b := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello"}`), hdr(HeaderSessionID, "s2"))
		assert.True(t, isPrefix(sysOnly, a))
		assert.True(t, isPrefix(sysOnly, b))
		assert.NotEqual(t, a[len(sysOnly)], b[len(sysOnly)], "different sessions diverge right after the system prompt")
	})
	t.Run("user field is the session unless the header says otherwise", func(t *testing.T) {
		withUser := `{"model":"m","user":"s1","messages":[{"role":"system","content":` + q(sys) + `},{"role":"user","content":"hello"}]}`
		a := keyOf(t, endpointChat, withUser, nil)
		b := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello"}`), hdr(HeaderSessionID, "s1"))
		c := keyOf(t, endpointChat, withUser, hdr(HeaderSessionID, "s2"))
		assert.Equal(t, a, b)
		assert.NotEqual(t, a, c)
	})
	t.Run("RAG header follows session", func(t *testing.T) {
		a := keyOf(t, endpointChat, base(`,{"role":"user","content":"q"}`), hdr(HeaderRAGContext, "doc-set-7"))
		b := keyOf(t, endpointChat, base(`,{"role":"user","content":"q"}`), hdr(HeaderRAGContext, "doc-set-8"))
		assert.True(t, isPrefix(sysOnly, a))
		assert.NotEqual(t, a[len(sysOnly)], b[len(sysOnly)])
	})
	t.Run("content parts equal plain text", func(t *testing.T) {
		a := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello world"}`), nil)
		b := keyOf(t, endpointChat, base(`,{"role":"user","content":[{"type":"text","text":"hello "},{"type":"text","text":"world"}]}`), nil)
		assert.Equal(t, a, b)
	})
	t.Run("roles are part of the key", func(t *testing.T) {
		a := keyOf(t, endpointChat, base(`,{"role":"user","content":"hello"}`), nil)
		b := keyOf(t, endpointChat, base(`,{"role":"assistant","content":"hello"}`), nil)
		assert.NotEqual(t, a, b)
	})
	t.Run("completions prompt string and list", func(t *testing.T) {
		a := keyOf(t, endpointCompletions, `{"model":"m","prompt":"one\ntwo"}`, nil)
		b := keyOf(t, endpointCompletions, `{"model":"m","prompt":["one","two"]}`, nil)
		c := keyOf(t, endpointCompletions, `{"model":"m","prompt":[1,2,3]}`, nil)
		assert.Equal(t, a, b)
		assert.NotEmpty(t, c)
	})
	t.Run("empty prompt still routes", func(t *testing.T) {
		a := keyOf(t, endpointCompletions, `{"model":"m","prompt":""}`, nil)
		assert.Len(t, a, 1)
	})
}

func hdr(k, v string) http.Header {
	h := http.Header{}
	h.Set(k, v)
	return h
}

func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A multi-turn chat's key extends the key of every earlier turn, so the
// replica that served the earlier turns matches them all.
func TestKeyMultiTurnProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sys := rapid.StringN(1, 300, -1).Draw(t, "system") // an empty request has a model-name key instead
		turns := rapid.SliceOfN(rapid.StringN(0, 200, -1), 1, 8).Draw(t, "turns")
		session := rapid.SampledFrom([]string{"", "s1", "user-42"}).Draw(t, "session")
		cut := rapid.IntRange(1, len(turns)).Draw(t, "cut")
		body := func(n int) string {
			msgs := []map[string]string{{"role": "system", "content": sys}}
			for i, tu := range turns[:n] {
				role := "user"
				if i%2 == 1 {
					role = "assistant"
				}
				msgs = append(msgs, map[string]string{"role": role, "content": tu})
			}
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "user": session})
			return string(b)
		}
		short := keyOf(t, endpointChat, body(cut), nil)
		long := keyOf(t, endpointChat, body(len(turns)), nil)
		if !isPrefix(short, long) {
			t.Fatalf("key of %d turns %v is not a prefix of key of %d turns %v", cut, short, len(turns), long)
		}
		if len(short) == 0 {
			t.Fatalf("empty key for %s", fmt.Sprint(body(cut)))
		}
	})
}

// TestKeyMatchesPrefixKey: a chat request with one system message, a
// session header and a RAG header, and no conversation, gets exactly the
// key keys.PrefixKey(system, session, rag) gives a Go service, whatever
// the segments' lengths (both use the library's segment roles). With a
// conversation, the key extends it.
func TestKeyMatchesPrefixKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text := func(label string) string {
			return rapid.StringMatching(`[a-zA-Z0-9 .,]{0,200}`).Draw(t, label)
		}
		system, session, rag := text("system"), text("session"), text("rag")
		if system == "" {
			system = "x" // a chat request needs a message
		}
		h := http.Header{}
		if session != "" {
			h.Set(HeaderSessionID, session)
		}
		if rag != "" {
			h.Set(HeaderRAGContext, rag)
		}
		body := `{"model":"m","messages":[{"role":"system","content":` + q(system) + `}]}`
		want := keys.PrefixKey(system, session, rag)
		require.Equal(t, want, keyOf(t, endpointChat, body, h))
		body = `{"model":"m","messages":[{"role":"system","content":` + q(system) + `},{"role":"user","content":"and a question"}]}`
		k := keyOf(t, endpointChat, body, h)
		require.Greater(t, len(k), len(want))
		require.Equal(t, want, k[:len(want)])
	})
}
