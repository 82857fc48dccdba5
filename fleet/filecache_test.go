package fleet

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countingRead reads a file's bytes, counting its calls.
func countingRead(n *int) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		*n++
		return os.ReadFile(p)
	}
}

// rewrite writes b to path and sets its modification time to mod, as a
// rewrite within one tick of the file system's clock leaves it.
func rewrite(t *testing.T, path string, b []byte, mod time.Time) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.NoError(t, os.Chtimes(path, mod, mod))
}

// TestFileCacheSameSizeAndTime: a file rewritten with contents of the same
// size and the same modification time is read again while its last read
// was within racyWindow of that time, and a file renamed over it is read
// again whenever; a file read long after its time is trusted by its size
// and time, and re-read contents equal to the last are no change.
func TestFileCacheSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	mod := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	rewrite(t, path, []byte("first-token"), mod)

	var age time.Duration
	var reads int
	c := fileCache[[]byte]{since: func(time.Time) time.Duration { return age }}
	get := func() ([]byte, bool) {
		v, changed, err := c.get(path, "token file", countingRead(&reads), bytes.Equal)
		require.NoError(t, err)
		return v, changed
	}

	// Read within the window of its time: a same-size, same-time rewrite
	// is seen.
	age = time.Second
	v, changed := get()
	require.Equal(t, "first-token", string(v))
	require.True(t, changed, "the first read is a change")
	rewrite(t, path, []byte("other-token"), mod)
	v, changed = get()
	require.Equal(t, "other-token", string(v), "a rewrite in the same tick, read within the window")
	require.True(t, changed)

	// Contents equal to the last read: read, but no change.
	v, changed = get()
	require.Equal(t, "other-token", string(v))
	require.False(t, changed, "same contents read again")

	// Long after its time: trusted by size and time, not read.
	age = time.Hour
	get() // the read that clears racy
	n := reads
	v, changed = get()
	require.Equal(t, n, reads, "a file read long after its time is not read again while it stays")
	require.Equal(t, "other-token", string(v))
	require.False(t, changed)

	// Replaced by a rename, same size and time: another file, read again.
	tmp := filepath.Join(dir, "token.new")
	rewrite(t, tmp, []byte("third-token"), mod)
	require.NoError(t, os.Rename(tmp, path))
	v, changed = get()
	require.Equal(t, "third-token", string(v), "a file renamed over it is another file")
	require.True(t, changed)
}
