package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUserStart(t *testing.T) {
	var u userStart
	// One system prompt of 3 blocks, then each conversation its own.
	assert.Equal(t, 0, u.block([]uint64{1, 2, 3, 10, 11}), "nothing known yet")
	assert.Equal(t, 3, u.block([]uint64{1, 2, 3, 20}), "the first branch is after the system prompt")
	assert.Equal(t, 3, u.block([]uint64{1, 2, 3, 10, 11, 12, 13}), "a later turn finds the same place")
	assert.Equal(t, 3, u.block([]uint64{1, 2, 3, 30, 31}))
	// A prompt without the system prompt branches at the root.
	assert.Equal(t, 0, u.block([]uint64{7, 8}))
	assert.Equal(t, 0, u.block([]uint64{1, 2, 3, 40}), "the root has branched now")

	var v userStart
	v.block([]uint64{5, 6})
	assert.Equal(t, 0, v.block([]uint64{9}), "no system prompt")
	assert.Equal(t, 0, v.block(nil))
}

// TestTraceUserBlock: the trace decoder marks where user messages begin,
// so that CHWBL keys a trace whose requests all share a first block on
// their user messages rather than on that block.
func TestTraceUserBlock(t *testing.T) {
	w, err := TraceFile("testdata/mooncake_fixture.jsonl", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sharedFirst{w}.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var r Request
	users := map[uint64]bool{}
	n := 0
	for st.Next(&r) == nil {
		n++
		if n > 1 {
			assert.GreaterOrEqual(t, r.UserBlock, 1, "request %d", n)
		}
		users[r.Blocks[r.UserBlock]] = true
	}
	assert.Greater(t, len(users), n/4, "user messages keyed apart: %d keys for %d requests", len(users), n)
}
