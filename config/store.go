package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// EnvVar names the environment variable that overrides the configuration
// file's location.
const EnvVar = "EXA_CONFIG"

// FileName is the configuration file's name inside the default directory.
const FileName = "routing.json"

// Path returns the configuration file's location: $EXA_CONFIG when set and
// non-empty, else routing.json in the "exa" directory under
// [os.UserConfigDir]. It fails only when neither is available.
func Path() (string, error) {
	if p := os.Getenv(EnvVar); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("gateway: no config location: set %s: %w", EnvVar, err)
	}
	return filepath.Join(dir, "exa", FileName), nil
}

// Load reads and validates the configuration at path. A file that does not
// exist yields an empty configuration (Version set, no models) and no
// error. A file that cannot be decoded yields an error wrapping
// [ErrCorrupt]; one with an invalid value yields an error wrapping
// [ErrInvalid]; both name the file. Load takes no lock: writers replace the
// file atomically, so it never sees a torn file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &File{Version: Version, Models: map[string]Model{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: read config: %w", err)
	}
	return Decode(path, data)
}

// Decode parses and validates configuration bytes; name labels errors
// (usually the file path). See [Load] for the errors. The document must be
// a JSON object: null, an array or a scalar is corrupt, and so are null
// values, keys given twice, unknown keys (field names are case-sensitive)
// and values of the wrong kind, each named by its path. An empty object,
// {}, is a valid empty configuration, as a missing file is. Empty replica
// lists and pool maps decode as nil, as Encode leaves them out.
func Decode(name string, data []byte) (*File, error) {
	if json.Valid(data) {
		// Syntax errors are left to the decoder below, which words them
		// as before; checkShape sees only well-formed JSON.
		if err := checkShape(data); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) { // a well-formed value out of range
				fe.File = name
				return nil, fe
			}
			return nil, fmt.Errorf("%w %s: %v", ErrCorrupt, name, err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("empty file")
		}
		return nil, fmt.Errorf("%w %s: %v", ErrCorrupt, name, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w %s: trailing data after the JSON object", ErrCorrupt, name)
	}
	if f.Version == 0 {
		f.Version = Version
	}
	if f.Version != Version {
		return nil, fmt.Errorf("%w %s: version %d, want %d", ErrCorrupt, name, f.Version, Version)
	}
	if f.Models == nil {
		f.Models = map[string]Model{}
	}
	for k, m := range f.Models {
		if len(m.Replicas) == 0 {
			m.Replicas = nil
		}
		if len(m.Pools) == 0 {
			m.Pools = nil
		}
		if len(m.Adapters) == 0 {
			m.Adapters = nil
		}
		if len(m.KVEventsAllow) == 0 {
			m.KVEventsAllow = nil
		}
		if len(m.Peers) == 0 {
			m.Peers = nil
		}
		f.Models[k] = m
	}
	if err := f.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			fe.File = name
		}
		return nil, err
	}
	return &f, nil
}

// Encode returns the file's canonical text: indented JSON, map keys sorted,
// ending in a newline. It validates f first.
func Encode(f *File) ([]byte, error) {
	c := f.Clone()
	if c.Version == 0 {
		c.Version = Version
	}
	if c.Models == nil {
		c.Models = map[string]Model{}
	}
	for _, m := range c.Models {
		for p, rs := range m.Pools {
			if rs == nil {
				m.Pools[p] = []Replica{} // [] rather than null, which Decode rejects
			}
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("gateway: encode config: %w", err)
	}
	return append(data, '\n'), nil
}

// Update applies fn to the configuration at path under an exclusive
// cross-process lock and writes the result atomically. fn receives the
// current configuration (empty if the file does not exist) and may modify
// it in place; if fn returns an error, or the file is corrupt or the result
// invalid, nothing is written and the error is returned. If the result
// encodes to the bytes already stored, the file is not rewritten. The
// directory is created if needed. Update is safe for concurrent use by
// goroutines and processes.
func Update(path string, fn func(*File) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("gateway: create config dir: %w", err)
	}
	unlock, err := lock(path + ".lock")
	if err != nil {
		return err
	}
	defer unlock()

	old, err := os.ReadFile(path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gateway: read config: %w", err)
	}
	f := &File{Version: Version, Models: map[string]Model{}}
	if exists {
		if f, err = Decode(path, old); err != nil {
			return err
		}
	}
	if err := fn(f); err != nil {
		return err
	}
	data, err := Encode(f)
	if err != nil {
		return err
	}
	if exists && bytes.Equal(data, old) {
		return nil
	}
	return writeAtomic(path, data)
}

// lock takes an exclusive flock on the named file, creating it if needed,
// and returns the function that releases it.
func lock(name string) (func(), error) {
	lf, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("gateway: open config lock: %w", err)
	}
	for {
		err = syscall.Flock(int(lf.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("gateway: lock config %s: %w", name, err)
	}
	return func() {
		_ = syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)
		lf.Close()
	}, nil
}

// writeAtomic writes data to a temporary file beside path, fsyncs it,
// renames it over path and fsyncs the directory. The existing file's
// permission bits are kept (0644 for a new file). Errors name path.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	perm := fs.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		if st.IsDir() {
			return fmt.Errorf("gateway: write %s: is a directory", path)
		}
		perm = st.Mode().Perm()
	}
	fail := func(err error) error { return fmt.Errorf("gateway: write %s: %w", path, err) }
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fail(err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err = tmp.Sync(); err != nil {
		return fail(err)
	}
	if err = tmp.Close(); err != nil {
		return fail(err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fail(err)
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory so a rename in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("gateway: sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("gateway: sync dir %s: %w", dir, err)
	}
	return nil
}

// WriteFileAtomic writes data to path atomically and durably (temporary
// file in the same directory, fsync, rename, fsync of the directory). It
// does not create the directory: a missing one is an error. It takes no
// lock; concurrent writers each leave a complete file and the last rename
// wins. A path naming a directory is an error.
func WriteFileAtomic(path string, data []byte) error {
	return writeAtomic(path, data)
}

// StatsDir returns the directory beside the configuration file at path in
// which the CLI keeps per-model statistics (the latest simulation result).
func StatsDir(path string) string {
	return filepath.Join(filepath.Dir(path), "stats")
}
