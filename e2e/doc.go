// Package e2e holds the end-to-end tests of the HTTP gateway against real
// engine processes (llm-d's vLLM simulator, pinned in ../tools) and the
// real exa binary. They are behind the e2e build tag so that
// `go test ./...` stays fast; run them with e2e/run.sh, which builds both
// binaries and runs `go test -tags e2e ./e2e/`.
package e2e
