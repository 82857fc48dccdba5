#!/usr/bin/env bash
# Installs the control plane that the Kubernetes tests run against:
# kube-apiserver (built from the Go module proxy) and etcd, into a cache
# OUTSIDE the repository:
#   ${EXA_K8S_CACHE:-$HOME/.cache/exa-k8s}/bin/{kube-apiserver,etcd}
# Point envtest at it with KUBEBUILDER_ASSETS=<that bin dir>.
#
# kube-apiserver: a scratch module requires k8s.io/kubernetes $K8S_VERSION and
# replaces every staging module it lists (k8s.io/api, apimachinery, client-go,
# ...) by its published v0.<minor>.<patch>; version info is set by -ldflags as
# the Kubernetes build does. Cold build: ~12-14 CPU minutes, 2+ GB at link.
# etcd: Debian's etcd-server package (apt-get) when root and available, else
# etcd $ETCD_VERSION built from the proxy in a scratch module.
# Work is skipped when a binary already exists; the script prints timings.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${EXA_K8S_CACHE:-$HOME/.cache/exa-k8s}
BIN=$CACHE/bin
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
export GOFLAGS=-mod=mod
mkdir -p "$BIN"

t0=$(date +%s)
since() { echo $(( $(date +%s) - $1 ))s; }

# --- kube-apiserver -------------------------------------------------------
build_apiserver() {
  local t=$(date +%s) src=$CACHE/src/kube-apiserver-$K8S_VERSION
  local staging_ver="v0.${K8S_VERSION#v1.}"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  mkdir -p "$src"; cd "$src"
  local modfile
  modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$modfile" ] || { echo "install.sh: cannot download k8s.io/kubernetes@$K8S_VERSION"; return 1; }
  # Every staging module k8s.io/kubernetes replaces with ./staging/src/...
  local staging
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$modfile")
  {
    echo "module exa.local/kube-apiserver"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $staging_ver"; done
    echo ")"
  } > go.mod
  echo "install.sh: kube-apiserver $K8S_VERSION: $(echo "$staging" | wc -w) staging modules replaced by $staging_ver"
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION"
  local pkg=k8s.io/component-base/version
  CGO_ENABLED=0 go build -trimpath -o "$BIN/kube-apiserver.tmp" \
    -ldflags "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
      -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z \
      -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver
  mv "$BIN/kube-apiserver.tmp" "$BIN/kube-apiserver"
  echo "install.sh: built kube-apiserver in $(since "$t")"
}

# --- etcd -----------------------------------------------------------------
install_etcd() {
  local t=$(date +%s)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -z "${EXA_ETCD_FROM_SOURCE:-}" ]; then
    if [ -x /usr/bin/etcd ] || { DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >/dev/null 2>&1 ||
         { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >/dev/null 2>&1; }; }; then
      # The package starts a system etcd on :2379; envtest runs its own on
      # free ports, so stop the service if one was started.
      command -v systemctl >/dev/null && systemctl disable --now etcd >/dev/null 2>&1 || true
      ln -sf /usr/bin/etcd "$BIN/etcd"
      echo "install.sh: etcd from Debian etcd-server ($(/usr/bin/etcd --version | sed -n 1p)) in $(since "$t")"
      return 0
    fi
    echo "install.sh: apt-get install etcd-server failed; building etcd $ETCD_VERSION from the module proxy"
  fi
  local src=$CACHE/src/etcd-$ETCD_VERSION
  mkdir -p "$src"; cd "$src"
  printf 'module exa.local/etcd\n\ngo %s\n' "$(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')" > go.mod
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
  echo "install.sh: built etcd $ETCD_VERSION in $(since "$t")"
}

if [ -x "$BIN/kube-apiserver" ]; then
  echo "install.sh: kube-apiserver present ($BIN/kube-apiserver)"
else
  (build_apiserver)
fi
if [ -x "$BIN/etcd" ]; then
  echo "install.sh: etcd present ($BIN/etcd)"
else
  (install_etcd)
fi
"$BIN/kube-apiserver" --version
"$BIN/etcd" --version | sed -n 1p  # sed reads it all: head could close the pipe early (SIGPIPE under pipefail)
echo "install.sh: KUBEBUILDER_ASSETS=$BIN  (total $(since "$t0"))"
