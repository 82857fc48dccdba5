package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
)

// Every `exa serve gateway` and `exa serve picker` records the outcome of
// its last load of the configuration file in a status file of its own
// (procs/CONFIG.PID.json beside the file), removed when it exits, so that
// `exa serve routing set` can wait for the running processes to load the
// version it wrote and fail when one could not apply it (a KV-event bind
// endpoint another process holds, say) rather than exit 0.

// reloadStatus is one process's status file.
type reloadStatus struct {
	PID     int    `json:"pid"`
	Command string `json:"command"` // gateway or picker
	// ModTime (Unix nanoseconds) and Size identify the version of the
	// configuration file last loaded.
	ModTime int64  `json:"mod_time_ns"`
	Size    int64  `json:"size"`
	Error   string `json:"error,omitempty"` // why it was not applied; "" if it was
}

// maxStatusBytes bounds a status file read.
const maxStatusBytes = 64 << 10

// statusDir is the directory of the status files of the processes
// serving the configuration at path; statusPrefix starts their names.
func statusDir(path string) string { return filepath.Join(filepath.Dir(path), "procs") }

func statusPrefix(path string) string { return filepath.Base(path) + "." }

// reloadRecorder returns an httpgw.Options.OnReload that writes this
// process's status file, and a function that removes it.
func reloadRecorder(path, command string, warn func(msg string, args ...any)) (func(fleet.ReloadResult), func()) {
	file := filepath.Join(statusDir(path), statusPrefix(path)+strconv.Itoa(os.Getpid())+".json")
	record := func(r fleet.ReloadResult) {
		st := reloadStatus{PID: os.Getpid(), Command: command, ModTime: r.ModTime.UnixNano(), Size: r.Size}
		if r.Err != nil {
			st.Error = r.Err.Error()
		}
		b, _ := json.Marshal(st)
		err := os.MkdirAll(filepath.Dir(file), 0o755)
		if err == nil {
			err = config.WriteFileAtomic(file, b)
		}
		if err != nil && warn != nil {
			warn("cannot record the reload status for exa serve routing set", "file", file, "err", err)
		}
	}
	return record, func() { _ = os.Remove(file) }
}

// readStatuses returns the status files of the live processes serving
// path (a file whose process is gone is removed).
func readStatuses(path string) []reloadStatus {
	dir := statusDir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []reloadStatus
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, statusPrefix(path)) || !strings.HasSuffix(name, ".json") {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(name, statusPrefix(path)), ".json"))
		if err != nil || pid <= 0 {
			continue
		}
		if !alive(pid) {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var st reloadStatus
		err = json.NewDecoder(io.LimitReader(f, maxStatusBytes)).Decode(&st)
		f.Close()
		if err == nil && st.PID == pid {
			out = append(out, st)
		}
	}
	return out
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// reloadWait is how long set waits for the running processes to load the
// version it wrote: three times their default reload interval.
const reloadWait = 3 * fleet.DefaultReloadInterval

// waitReloads waits, up to wait, for every live process serving path to
// record a load of the file's current version. It returns an error naming
// each process that failed to apply it, and the processes that had not
// loaded it within wait (they may poll less often: --reload-interval).
func waitReloads(path string, wait time.Duration, sleep func(time.Duration)) (pending []reloadStatus, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil
	}
	deadline := time.Now().Add(wait)
	for {
		pending = pending[:0]
		var failed []string
		for _, st := range readStatuses(path) {
			if st.ModTime != fi.ModTime().UnixNano() || st.Size != fi.Size() {
				pending = append(pending, st)
				continue
			}
			if st.Error != "" {
				failed = append(failed, fmt.Sprintf("exa serve %s (pid %d) could not apply it, and keeps its previous configuration: %s", st.Command, st.PID, st.Error))
			}
		}
		if len(failed) > 0 {
			return pending, errors.New(strings.Join(failed, "; "))
		}
		if len(pending) == 0 || !time.Now().Before(deadline) {
			return pending, nil
		}
		sleep(100 * time.Millisecond)
	}
}
