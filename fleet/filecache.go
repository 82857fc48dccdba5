package fleet

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// racyWindow is how close to its modification time a file read may be
// and still miss a rewrite that leaves its size and time as they were (one
// tick of the file system's clock): such a read is repeated at the next
// get, as the API keys file's is (internal/apikeys).
const racyWindow = 2 * time.Second

// fileCache is what a file held, read by read and read again when the
// file is replaced, or its size or modification time changes, or it was
// last read within racyWindow of that time: the peer token and the peer
// CA file. Safe for concurrent use; the zero value has read nothing.
type fileCache[T any] struct {
	mu    sync.Mutex
	read  bool        // v holds a good read
	fi    os.FileInfo // the file as last read
	racy  bool        // last read within racyWindow of fi's time
	v     T
	since func(time.Time) time.Duration // nil: time.Since (tests)
}

// get returns the value of the file at path: the last good read when the
// file is the one read then, with the size and modification time it had,
// else a new read, changed when eq says it differs from the last good
// one. A failed stat is an error naming what the file is; a failed read
// returns read's error. Either way nothing is returned and the last good
// value stays for the next call.
func (c *fileCache[T]) get(path, what string, read func(string) (T, error), eq func(a, b T) bool) (v T, changed bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return v, false, fmt.Errorf("%s: %w", what, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read && !c.racy && os.SameFile(fi, c.fi) && fi.ModTime().Equal(c.fi.ModTime()) && fi.Size() == c.fi.Size() {
		return c.v, false, nil
	}
	if v, err = read(path); err != nil {
		return v, false, err
	}
	since := c.since
	if since == nil {
		since = time.Since
	}
	changed = !c.read || !eq(c.v, v)
	if changed {
		c.v = v
	}
	c.read, c.fi, c.racy = true, fi, since(fi.ModTime()) < racyWindow
	return c.v, changed, nil
}
