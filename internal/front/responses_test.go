package front

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResponseID: the id is the first "id" whose string value starts with
// "resp", in an answer or an event stream, whitespace allowed.
func TestResponseID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"resp_1","object":"response"}`:                                                           "resp_1",
		`{"object":"response", "id" : "resp_2"}`:                                                        "resp_2",
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_3\"": "resp_3",
		`{"output":[{"id":"msg_1"}],"id":"resp_4"}`:                                                     "resp_4",
		`{"id":"resp_\"5"}`: "",
		`{"id":"resp_6`:     "",
		`{"id":7}`:          "",
		``:                  "",
	} {
		assert.Equal(t, want, ResponseID([]byte(in)), "%q", in)
	}
}

// FuzzResponseID: any answer head gives the same id through ResponseHead,
// however it is cut in two chunks, as ResponseID reads in its first
// MaxResponseHead bytes; and an id that occurs in it, starts
// with "resp" and holds no quote or backslash, or none; never a panic.
func FuzzResponseID(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, "data: {\"response\":{\"id\" :\t\"resp_x\"}}", `{"id":"msg"},{"id":"resp"}`, `"id"`, `"id":`, `"id":"`} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Add([]byte(strings.Repeat(" ", MaxResponseHead-8)+`{"id":"resp_past"}`), uint16(100))
	f.Fuzz(func(t *testing.T, head []byte, cut uint16) {
		id := ResponseID(head)
		// A ResponseHead fed head in two chunks, cut anywhere, learns
		// what ResponseID reads in its first MaxResponseHead bytes.
		var h ResponseHead
		c := min(int(cut), len(head))
		got, done := h.Feed(head[:c])
		if !done {
			got, done = h.Feed(head[c:])
		}
		if want := ResponseID(head[:min(len(head), MaxResponseHead)]); got != want || (want == "" && done != (len(head) >= MaxResponseHead)) {
			t.Fatalf("Feed(%q | %q) = %q, %v; want %q", head[:c], head[c:], got, done, want)
		}
		if id == "" {
			return
		}
		if !strings.HasPrefix(id, "resp") || strings.ContainsAny(id, "\"\\") || !strings.Contains(string(head), `"`+id+`"`) {
			t.Fatalf("ResponseID(%q) = %q", head, id)
		}
	})
}

// TestResponseHead: the id is learned from a head in one chunk or cut
// across several (an SSE answer's response.created event), not past
// MaxResponseHead; a head read at once from its first chunk allocates
// nothing but the id.
func TestResponseHead(t *testing.T) {
	sse := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_e1_7\",\"object\":\"response\"}}\n\n"
	for cut := range len(sse) {
		var h ResponseHead
		id, done := h.Feed([]byte(sse[:cut]))
		if !done {
			id, done = h.Feed([]byte(sse[cut:]))
		}
		require.True(t, done, "cut %d", cut)
		require.Equal(t, "resp_e1_7", id, "cut %d", cut)
	}
	var h ResponseHead
	pad := []byte(strings.Repeat(" ", MaxResponseHead-4))
	id, done := h.Feed(pad)
	require.False(t, done)
	require.Empty(t, id)
	id, done = h.Feed([]byte(`{"id":"resp_late"}`))
	require.True(t, done, "the head is read")
	require.Empty(t, id, "an id past MaxResponseHead is not learned")
	h.Reset()
	id, done = h.Feed([]byte(`{"id":"resp_again"}`))
	require.Equal(t, "resp_again", id)
	require.True(t, done)
	one := []byte(`{"id":"resp_0123456789abcdef0123456789abcdef","object":"response"}`)
	allocs := testing.AllocsPerRun(100, func() {
		var h ResponseHead
		if id, _ := h.Feed(one); id == "" {
			t.Fatal("no id")
		}
	})
	require.Equal(t, 1.0, allocs, "the id's string only")
}
