package main

import (
	"runtime/debug"
	"strings"
)

// version, when set at link time (-ldflags "-X main.version=v1.2.3", as
// deploy/image/Dockerfile does with its VERSION argument), is the version
// `exa --version` prints; "" means the build information's.
var version = ""

// buildVersion returns the version `exa --version` prints, from the
// binary's build information: the main module's version (a tag, or a
// pseudo-version when built with go install), else the VCS revision
// (with +dirty for a modified tree), and the Go version.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if version != "" {
		return version + " " + bi.GoVersion
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "(devel)"
		if rev != "" {
			v = rev[:min(12, len(rev))] + dirty
		}
	}
	return strings.Join([]string{v, bi.GoVersion}, " ")
}
