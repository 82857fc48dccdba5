package apikeys

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRefreshSameSizeAndTime: a key replaced by one of the same length
// is in force after the next refresh even when the file's modification
// time did not move (a rewrite within one tick of the file system's
// clock, about 4 ms on ext4; or a copy that keeps the time) or the file
// was swapped by a rename (a Secret's symlink swap, rsync, an editor).
func TestRefreshSameSizeAndTime(t *testing.T) {
	for _, tt := range []struct {
		name    string
		replace func(t *testing.T, path string, mod time.Time)
	}{
		{"rewritten in place, same time", func(t *testing.T, path string, mod time.Time) {
			require.NoError(t, os.WriteFile(path, []byte("sk-key-0002\n"), 0o600))
			require.NoError(t, os.Chtimes(path, mod, mod))
		}},
		{"renamed over, same old time", func(t *testing.T, path string, mod time.Time) {
			tmp := path + ".new"
			require.NoError(t, os.WriteFile(tmp, []byte("sk-key-0002\n"), 0o600))
			require.NoError(t, os.Chtimes(tmp, mod, mod))
			require.NoError(t, os.Rename(tmp, path))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys")
			require.NoError(t, os.WriteFile(path, []byte("sk-key-0001\n"), 0o600))
			mod := time.Now().Add(-time.Hour)
			if tt.name == "rewritten in place, same time" {
				mod = time.Now() // as written: recent
			}
			require.NoError(t, os.Chtimes(path, mod, mod))
			var mu sync.Mutex
			now := time.Unix(1000, 0)
			f, err := Load(path, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
			require.NoError(t, err)
			require.True(t, f.Allowed("Bearer sk-key-0001"))
			tt.replace(t, path, mod)
			mu.Lock()
			now = now.Add(time.Second)
			mu.Unlock()
			require.NoError(t, f.Refresh())
			require.True(t, f.Allowed("Bearer sk-key-0002"), "the new key")
			require.False(t, f.Allowed("Bearer sk-key-0001"), "the revoked key")
		})
	}
}
