#!/usr/bin/env bash
# Builds the NetworkPolicy engine of the test node: kube-network-policies
# (sigs.k8s.io/kube-network-policies, the Kubernetes SIG Network's nfqueue-based implementation)
# from its Go module, pinned by scripts/node/network-policies/go.{mod,sum} (only those and a small
# main are committed: upstream's controller package started with a kubeconfig, as a host process;
# see that main.go). test/helpers/network-policy.ts runs it beside kube-proxy on a real node, so
# the cluster suite proves the chart's and the operator's NetworkPolicies by refused connections.
# Needs the kernel's nfnetlink_queue and nf_tables at run time, not to build.
#
# Output: a version-keyed directory outside the clone, printed on stdout as the last line:
#   ${X402_FLEET_CACHE:-~/.cache/x402-fleet}/network-policies-<version>-<hash of the pins>/
# holding kube-network-policies and VERSIONS. A second run is a stat. It takes the control plane's
# build lock: on a cold machine the builds share the Go caches, never the cores.
#
# Usage: scripts/build-network-policies.sh [--print-dir]   (--print-dir: no build, just the path)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
wrapper="$here/node/network-policies"

version="$(awk '$1 == "sigs.k8s.io/kube-network-policies" { print $2; exit } $1 == "require" && $2 == "sigs.k8s.io/kube-network-policies" { print $3; exit }' "$wrapper/go.mod")"
[[ -n "$version" ]] || { echo "cannot read the pinned kube-network-policies version from $wrapper/go.mod" >&2; exit 1; }

recipe=1
pins_hash="$( (echo "recipe=$recipe"; cat "$wrapper/go.mod" "$wrapper/go.sum" "$wrapper/main.go"; sed -n '/^# ---- build/,$p' "$0") | sha256sum | cut -c1-12)"
cache_root="${X402_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/x402-fleet}"
out="$cache_root/network-policies-$version-$pins_hash"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi
if [[ -f "$out/.complete" ]]; then echo "$out"; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9 # a control-plane, node or Prometheus build may be running: wait for it
if [[ -f "$out/.complete" ]]; then echo "$out"; exit 0; fi

# ---- build --------------------------------------------------------------------------------------
start=$(date +%s)
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { echo "Go is needed to build kube-network-policies" >&2; exit 1; }

# As the control plane: static, reproducible, offline after the download; nice and -p 2 on a shared machine.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

echo "network-policies: building kube-network-policies (sigs.k8s.io/kube-network-policies $version)" >&2
(cd "$wrapper" && nice -n 19 "$go" build -p 2 -ldflags "-s -w" -o "$tmp/kube-network-policies" .)

[[ -s "$tmp/kube-network-policies" ]] || { echo "missing kube-network-policies" >&2; exit 1; }
printf 'kube_network_policies=%s\ngo=%s\nbuild_seconds=%s\n' "$version" "$("$go" env GOVERSION)" "$(( $(date +%s) - start ))" > "$tmp/VERSIONS"
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out" # atomic: readers see no directory or a complete one
trap - EXIT
echo "network-policies: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
