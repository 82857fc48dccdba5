#!/usr/bin/env bash
# Builds GIE's own endpoint picker (cmd/epp, $GIE_VERSION) into the same
# cache as install.sh, for the side-by-side comparison: a scratch module
# requiring sigs.k8s.io/gateway-api-inference-extension (go install ...@v
# is refused). Skipped when the binary exists; prints its time.
set -euo pipefail
GIE_VERSION=${GIE_VERSION:-v1.5.0}
CACHE=${EXA_K8S_CACHE:-$HOME/.cache/exa-k8s}
BIN=$CACHE/bin
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
export GOFLAGS=-mod=mod
mkdir -p "$BIN"
if [ -x "$BIN/gie-epp" ]; then
  echo "install-gie-epp.sh: gie-epp present ($BIN/gie-epp)"; exit 0
fi
t=$(date +%s)
src=$CACHE/src/gie-epp-$GIE_VERSION
mkdir -p "$src"; cd "$src"
printf 'module exa.local/gie-epp\n\ngo %s\n' "$(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')" > go.mod
go get "sigs.k8s.io/gateway-api-inference-extension/cmd/epp@$GIE_VERSION"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/gie-epp.tmp" sigs.k8s.io/gateway-api-inference-extension/cmd/epp
mv "$BIN/gie-epp.tmp" "$BIN/gie-epp"
echo "install-gie-epp.sh: built GIE's epp $GIE_VERSION in $(( $(date +%s) - t ))s"
