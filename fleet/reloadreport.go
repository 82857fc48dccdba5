package fleet

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"time"
)

// ReloadResult is one load of the configuration file (Options.OnReload).
type ReloadResult struct {
	// Path is the file; ModTime and Size identify the version read (as
	// os.Stat gave them just before).
	Path    string
	ModTime time.Time
	Size    int64
	// Err is why the version was not applied (the running configuration
	// stays); nil when it was.
	Err error
}

// reportReload passes the outcome of loading the version fi of path to
// Options.OnReload.
func (s *Fleet) reportReload(path string, fi os.FileInfo, err error) {
	if s.opts.OnReload == nil {
		return
	}
	s.opts.OnReload(ReloadResult{Path: path, ModTime: fi.ModTime(), Size: fi.Size(), Err: err})
}

// bindInUseHint explains a KV-event bind endpoint another process holds
// (field names it in the configuration), "" for other errors. Only one
// process can listen on an endpoint: typically a second front (`exa serve
// gateway` and `exa serve picker`, or two gateways) on one configuration.
func bindInUseHint(err error, field string) string {
	if !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
		return ""
	}
	model := strings.TrimSuffix(strings.TrimPrefix(field, "models."), ".kv_events_bind")
	if model == field || model == "" {
		model = "MODEL"
	}
	return "; another process listens there (another exa serve gateway or picker on this configuration?), and only one process " +
		"can bind a KV-event endpoint: run one front per bind endpoint (separate configurations with different --kv-events-bind), " +
		"or have the engines' publishers bind and every front connect to them (exa serve routing set " + model +
		" --kv-events-bind \"\" --kv-events-connect NAME=tcp://ENGINE:PORT)"
}
