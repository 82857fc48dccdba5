package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/fleet"
)

// A status file that cannot be written is warned about, as a status
// directory that cannot be made is (the write's error was dropped).
func TestReloadRecorderWarnsOnWriteFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "exa.json")
	file := filepath.Join(statusDir(path), statusPrefix(path)+strconv.Itoa(os.Getpid())+".json")
	require.NoError(t, os.MkdirAll(file, 0o755)) // a directory where the file goes
	var warned []string
	record, remove := reloadRecorder(path, "serve", func(msg string, args ...any) {
		warned = append(warned, fmt.Sprint(append([]any{msg}, args...)...))
	})
	defer remove()
	record(fleet.ReloadResult{Path: path, ModTime: time.Now(), Size: 1})
	require.Len(t, warned, 1)

	// Writable: no warning, and the status is read back.
	require.NoError(t, os.Remove(file))
	warned = nil
	record(fleet.ReloadResult{Path: path, ModTime: time.Now(), Size: 1})
	require.Empty(t, warned)
	require.Len(t, readStatuses(path), 1)
}
