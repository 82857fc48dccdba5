package front

import (
	"fmt"
	"os"
	"runtime"
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

// TestResponseIDsBound: the store keeps the most recent MaxResponseIDs
// ids and forgets the oldest first.
func TestResponseIDsBound(t *testing.T) {
	var r ResponseIDs
	for i := range MaxResponseIDs + 10 {
		r.Add(fmt.Sprintf("resp_%d", i), "m", "r0")
	}
	require.Len(t, r.m, MaxResponseIDs)
	_, ok := r.Owner("resp_9", "m")
	require.False(t, ok, "the oldest ids are forgotten")
	got, ok := r.Owner(fmt.Sprintf("resp_%d", MaxResponseIDs+9), "m")
	require.True(t, ok)
	require.Equal(t, "r0", got)
	_, ok = r.Owner(fmt.Sprintf("resp_%d", MaxResponseIDs+9), "other")
	require.False(t, ok, "an id is its model's")
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

// TestResponseIDsMemory measures the store at its bound (EXA_MEASURE=1):
// MaxResponseIDs ids of vLLM's shape ("resp_" and 32 hex digits).
func TestResponseIDsMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var r ResponseIDs
	for i := range MaxResponseIDs {
		r.Add(fmt.Sprintf("resp_%032x", i), "meta-llama/Llama-3.1-8B-Instruct", fmt.Sprintf("r%d", i%8))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%d ids: %.1f MiB, %.0f bytes an id", MaxResponseIDs, float64(after.HeapAlloc-before.HeapAlloc)/(1<<20),
		float64(after.HeapAlloc-before.HeapAlloc)/MaxResponseIDs)
	runtime.KeepAlive(&r)
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
