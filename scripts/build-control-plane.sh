#!/usr/bin/env bash
# Builds the real Kubernetes control plane the operator and chart tests run against:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes),
# from the Go module proxy, pinned by the wrapper modules in scripts/control-plane/*/go.{mod,sum}
# (only those files are committed, never binaries).
#
# Output: a version-keyed directory outside the clone, printed on stdout as the last line:
#   ${X402_FLEET_CACHE:-~/.cache/x402-fleet}/k8s-<kubernetes version>-<hash of the pins>/
# A second run is a stat. Concurrent runs (npm pretest, vitest globalSetup) wait on one lock.
#
# If KUBEBUILDER_ASSETS is set (the envtest convention) and holds etcd and kube-apiserver,
# nothing is built and that directory is printed instead: users with envtest assets need no Go.
#
# Usage: scripts/build-control-plane.sh [--print-dir]   (--print-dir: no build, just the path)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
wrappers="$here/control-plane"

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if [[ -x "$KUBEBUILDER_ASSETS/etcd" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]]; then
    echo "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no etcd/kube-apiserver" >&2
  exit 1
fi

# The pinned versions, read from the wrapper modules (the single source of truth).
modversion() { # <wrapper> <module>: its version in a require line or block
  awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$wrappers/$1/go.mod"
}
k8s_version="$(modversion kubernetes k8s.io/kubernetes)"
etcd_version="$(modversion etcd go.etcd.io/etcd/server/v3)"
kwok_version="$(modversion kwok sigs.k8s.io/kwok)"
[[ -n "$k8s_version" && -n "$etcd_version" && -n "$kwok_version" ]] || { echo "cannot read pinned versions" >&2; exit 1; }

# The key covers every pin (go.mod + go.sum) and the build recipe version below, so a changed pin
# builds into a new directory and never mixes binaries.
recipe=1
pins_hash="$( (echo "recipe=$recipe"; cat "$wrappers"/*/go.mod "$wrappers"/*/go.sum) | sha256sum | cut -c1-12)"
cache_root="${X402_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/x402-fleet}"
out="$cache_root/k8s-$k8s_version-$pins_hash"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
complete() { [[ -f "$out/.complete" ]]; }
if complete; then echo "$out"; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9 # another process may be building the same key: wait for it, then reuse its result
if complete; then echo "$out"; exit 0; fi

go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { echo "Go is needed to build the control plane (or set KUBEBUILDER_ASSETS)" >&2; exit 1; }

# Reproducible, static, offline-after-download builds with the local toolchain only; nice and
# -p 2 because the machine is shared with other test runs.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

minor="${k8s_version#v1.}"; minor="${minor%%.*}"
# What `kubectl version` and helm's kubeVersion checks read (hack/lib/version.sh sets the same).
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # <wrapper dir> <output name> <package> <ldflags>
  echo "control plane: building $2 ($3)" >&2
  (cd "$wrappers/$1" && nice -n 19 "$go" build -p 2 -ldflags "$4" -o "$tmp/$2" "$3")
}
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${k8s_version#v}"

for b in "${binaries[@]}"; do [[ -x "$tmp/$b" ]] || { echo "missing $b" >&2; exit 1; }; done
printf 'kubernetes=%s\netcd=%s\nkwok=%s\nbuild_seconds=%s\n' \
  "$k8s_version" "$etcd_version" "$kwok_version" "$(( $(date +%s) - start ))" > "$tmp/VERSIONS"
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out" # atomic: readers see no directory or a complete one
trap - EXIT
echo "control plane: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
