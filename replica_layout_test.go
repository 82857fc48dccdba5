package gateway

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestReplicaStateLayout: replicaState is 256 bytes, a size class whose
// objects are 256-byte aligned, and the fields every Route reads of every
// replica lie in its first 64 bytes, one cache line.
func TestReplicaStateLayout(t *testing.T) {
	var rs replicaState
	require.Equal(t, uintptr(256), unsafe.Sizeof(rs))
	for name, end := range map[string]uintptr{
		"slot":     unsafe.Offsetof(rs.slot) + unsafe.Sizeof(rs.slot),
		"healthy":  unsafe.Offsetof(rs.healthy) + unsafe.Sizeof(rs.healthy),
		"queue":    unsafe.Offsetof(rs.queue) + unsafe.Sizeof(rs.queue),
		"running":  unsafe.Offsetof(rs.running) + unsafe.Sizeof(rs.running),
		"peer":     unsafe.Offsetof(rs.peer) + unsafe.Sizeof(rs.peer),
		"kv":       unsafe.Offsetof(rs.kv) + unsafe.Sizeof(rs.kv),
		"latency":  unsafe.Offsetof(rs.latency) + unsafe.Sizeof(rs.latency),
		"inflight": unsafe.Offsetof(rs.inflight) + unsafe.Sizeof(rs.inflight),
		"pending":  unsafe.Offsetof(rs.pending) + unsafe.Sizeof(rs.pending),
		"assigned": unsafe.Offsetof(rs.assigned) + unsafe.Sizeof(rs.assigned),
	} {
		require.LessOrEqual(t, end, uintptr(64), name)
	}
	g, err := New(replicaNames(3))
	require.NoError(t, err)
	for _, r := range g.snap.Load().list {
		require.Zero(t, uintptr(unsafe.Pointer(r))%64, "replica %s is cache-line aligned", r.name)
	}
}
