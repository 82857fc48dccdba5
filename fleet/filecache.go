package fleet

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// fileCache is what a file held, read by read and read again only when
// the file's size or modification time changes: the peer token and the
// peer CA file. Safe for concurrent use; the zero value has read nothing.
type fileCache[T any] struct {
	mu   sync.Mutex
	read bool // v holds a good read
	mod  time.Time
	size int64
	v    T
}

// get returns the value of the file at path: the last good read when the
// file's size and modification time are those it had then, else a new
// read (changed). A failed stat is an error naming what the file is; a
// failed read returns read's error. Either way nothing is returned and
// the last good value stays for the next call.
func (c *fileCache[T]) get(path, what string, read func(string) (T, error)) (v T, changed bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return v, false, fmt.Errorf("%s: %w", what, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read && fi.ModTime().Equal(c.mod) && fi.Size() == c.size {
		return c.v, false, nil
	}
	if v, err = read(path); err != nil {
		return v, false, err
	}
	c.v, c.read, c.mod, c.size = v, true, fi.ModTime(), fi.Size()
	return v, true, nil
}
