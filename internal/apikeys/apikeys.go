// Package apikeys checks clients' API keys against a file of the keys
// allowed, re-read when it changes: the HTTP gateway's --api-keys-file.
//
// The file holds one key per line; blank lines and lines starting with
// '#' are skipped, and white space around a key is trimmed. A key is 8 to
// 4,096 bytes of printable ASCII without spaces. Only the keys' SHA-256
// digests are kept in memory, and a request's key is found by its
// digest, so a lookup's time does not depend on how much of a wrong key
// matches a right one.
package apikeys

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of a keys file.
const (
	MinKeyBytes = 8
	MaxKeyBytes = 4096
	MaxKeys     = 65536
	// maxFileBytes bounds the file read: MaxKeys keys of the longest
	// length would be 256 MiB; keys are short, so 16 MiB is plenty.
	maxFileBytes = 16 << 20
)

// racyWindow is how recent a file's modification time must be for a
// read of it to be repeated at the next look (file system clocks tick
// coarsely: about 4 ms on ext4).
const racyWindow = 2 * time.Second

// Parse reads a keys file's contents: the set of digests of its keys. An
// error names the line at fault.
func Parse(b []byte) (map[[32]byte]struct{}, error) {
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("over %d bytes", maxFileBytes)
	}
	set := map[[32]byte]struct{}{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), MaxKeyBytes+1024)
	line := 1
	for ; sc.Scan(); line++ {
		k := bytes.TrimSpace(sc.Bytes())
		if len(k) == 0 || k[0] == '#' {
			continue
		}
		switch {
		case len(k) < MinKeyBytes:
			return nil, fmt.Errorf("line %d: a key of %d bytes, want at least %d", line, len(k), MinKeyBytes)
		case len(k) > MaxKeyBytes:
			return nil, fmt.Errorf("line %d: a key of %d bytes, want at most %d", line, len(k), MaxKeyBytes)
		case bytes.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
			return nil, fmt.Errorf("line %d: a key holds a space, a control character or a byte outside ASCII", line)
		}
		d := sha256.Sum256(k)
		if _, dup := set[d]; dup {
			return nil, fmt.Errorf("line %d: a key listed twice", line)
		}
		if len(set) == MaxKeys {
			return nil, fmt.Errorf("line %d: more than %d keys", line, MaxKeys)
		}
		set[d] = struct{}{}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: over %d bytes", line, MaxKeyBytes+1024)
		}
		return nil, err
	}
	if len(set) == 0 {
		return nil, errors.New("no key in it")
	}
	return set, nil
}

// File is the keys of a keys file, re-read when it is replaced, or its
// size or modification time changes (or changed within racyWindow of
// the last read, when only its contents tell), looked at no more than
// once a second. Safe for concurrent use.
type File struct {
	path string
	now  func() time.Time

	keys atomic.Pointer[map[[32]byte]struct{}]

	// nextLook is when Refresh may look at the file again (UnixNano).
	nextLook atomic.Int64

	mu     sync.Mutex
	fi     os.FileInfo // the file as last read
	digest [32]byte    // of its contents as last read
	// racy: the file was read within racyWindow of its modification
	// time, so a rewrite of the same size in the same tick of the file
	// system's clock would leave both unchanged: read it again.
	racy     bool
	lastErr  string
	rejected atomic.Uint64
}

// Load reads the keys file at path; now is the clock (nil: time.Now).
// An error names the file.
func Load(path string, now func() time.Time) (*File, error) {
	if now == nil {
		now = time.Now
	}
	f := &File{path: path, now: now}
	if _, err := f.reload(); err != nil {
		return nil, err
	}
	f.nextLook.Store(now().Add(time.Second).UnixNano())
	return f, nil
}

// reload reads the file when it changed, under mu (or before f is
// shared), reporting whether it read it.
func (f *File) reload() (bool, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return false, fmt.Errorf("API keys file: %w", err)
	}
	if f.keys.Load() != nil && !f.racy && os.SameFile(fi, f.fi) && fi.ModTime().Equal(f.fi.ModTime()) && fi.Size() == f.fi.Size() {
		return false, nil
	}
	fh, err := os.Open(f.path)
	if err != nil {
		return false, fmt.Errorf("API keys file: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxFileBytes+1))
	if err != nil {
		return false, fmt.Errorf("API keys file %s: %w", f.path, err)
	}
	racy := time.Since(fi.ModTime()) < racyWindow
	d := sha256.Sum256(b)
	if f.keys.Load() != nil && d == f.digest {
		f.fi, f.racy = fi, racy
		return false, nil
	}
	set, err := Parse(b)
	if err != nil {
		return false, fmt.Errorf("API keys file %s: %w", f.path, err)
	}
	f.keys.Store(&set)
	f.fi, f.digest, f.racy = fi, d, racy
	return true, nil
}

// Refresh re-reads the file if a second has passed since it was last
// looked at and it changed. It returns the error of a failed re-read
// the first time that error is seen (nil after, and nil on success): the
// keys read last stay in force meanwhile.
//
// Requests call it on their way: within the second it costs one atomic
// load, and while one request re-reads the file the others go on with
// the keys in force rather than wait.
func (f *File) Refresh() error {
	now := f.now()
	if now.UnixNano() < f.nextLook.Load() || !f.mu.TryLock() {
		return nil
	}
	defer f.mu.Unlock()
	if now.UnixNano() < f.nextLook.Load() { // another looked meanwhile
		return nil
	}
	f.nextLook.Store(now.Add(time.Second).UnixNano())
	_, err := f.reload()
	if err == nil {
		f.lastErr = ""
		return nil
	}
	if err.Error() == f.lastErr {
		return nil
	}
	f.lastErr = err.Error()
	return err
}

// Bearer returns the credentials of an Authorization value of the Bearer
// scheme, whose name is matched without regard to case (RFC 7235 §2.1:
// "bearer", "BEARER"), followed by one or more spaces.
func Bearer(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(tok, " "), true
}

// Allowed reports whether the Authorization value v carries one of the
// keys (Bearer).
func (f *File) Allowed(v string) bool {
	if key, ok := Bearer(v); ok && len(key) <= MaxKeyBytes {
		// Hashed from a copy on the stack: []byte(key) would be a heap
		// allocation a request for a key past 32 bytes.
		var buf [MaxKeyBytes]byte
		if _, ok := (*f.keys.Load())[sha256.Sum256(buf[:copy(buf[:], key)])]; ok {
			return true
		}
	}
	f.rejected.Add(1)
	return false
}

// Len is the number of keys in force.
func (f *File) Len() int { return len(*f.keys.Load()) }

// Rejected counts the values Allowed refused.
func (f *File) Rejected() uint64 { return f.rejected.Load() }
