//go:build tools

// Package tools pins the versions of external programs used by the
// end-to-end tests, kept apart from the library's go.mod.
package tools

import (
	_ "github.com/llm-d/llm-d-inference-scheduler/cmd/pd-sidecar"
	_ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
)
