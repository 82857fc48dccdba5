#!/usr/bin/env bash
# Builds the engine simulator and llm-d's P/D sidecar (both pinned in
# tools/) and the exa binary, then runs the end-to-end tests against them.
# Extra arguments go to go test, e.g. e2e/run.sh -run TestAddedLatency.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${EXA_E2E_BIN:-${TMPDIR:-/tmp}/exa-e2e-bin}
mkdir -p "$bin"
echo "e2e: building llm-d-inference-sim (tools module; slow on a cold cache)" >&2
(cd "$root/tools" && CGO_ENABLED=0 go build -o "$bin/llm-d-inference-sim" github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim)
echo "e2e: building pd-sidecar (llm-d-inference-scheduler, tools module)" >&2
(cd "$root/tools" && CGO_ENABLED=0 go build -o "$bin/pd-sidecar" github.com/llm-d/llm-d-inference-scheduler/cmd/pd-sidecar)
echo "e2e: building exa" >&2
(cd "$root" && go build -o "$bin/exa" ./cmd/exa)
cd "$root"
EXA_E2E_SIM="$bin/llm-d-inference-sim" EXA_E2E_SIDECAR="$bin/pd-sidecar" EXA_E2E_EXA="$bin/exa" \
	go test -tags e2e -count=1 -v -timeout 20m ./e2e/ "$@"
