#!/usr/bin/env bash
# Builds Prometheus and promtool for the monitoring suites (test/monitoring.test.ts): a real
# Prometheus scrapes the devnet's services and answers every dashboard query; promtool unit-tests
# every alert of the chart's PrometheusRule. From the Go module proxy, pinned by the wrapper module
# scripts/prometheus/go.{mod,sum} (only those files are committed, never binaries).
#
# Output: a version-keyed directory outside the clone, printed on stdout as the last line:
#   ${X402_FLEET_CACHE:-~/.cache/x402-fleet}/prometheus-<version>-<hash of the pins>/
# A second run is a stat. Concurrent runs wait on one lock.
#
# If PROMETHEUS_BIN_DIR holds prometheus and promtool, nothing is built and it is printed instead.
#
# Usage: scripts/build-prometheus.sh [--print-dir]   (--print-dir: no build, just the path)
set -euo pipefail

if [[ -n "${PROMETHEUS_BIN_DIR:-}" ]]; then
  if [[ -x "$PROMETHEUS_BIN_DIR/prometheus" && -x "$PROMETHEUS_BIN_DIR/promtool" ]]; then echo "$PROMETHEUS_BIN_DIR"; exit 0; fi
  echo "PROMETHEUS_BIN_DIR=$PROMETHEUS_BIN_DIR has no prometheus/promtool" >&2
  exit 1
fi

wrapper="$(cd "$(dirname "$0")" && pwd)/prometheus"
module_version="$(awk '$1 == "github.com/prometheus/prometheus" && $2 ~ /^v/ { print $2; exit }' "$wrapper/go.mod")"
[[ -n "$module_version" ]] || { echo "cannot read the pinned Prometheus version" >&2; exit 1; }
# The Go module v0.MMMPP.x is Prometheus M.PP.x (v0.316.0 → 3.16.0).
minor_part="${module_version#v0.}"; minor_part="${minor_part%%.*}"
patch="${module_version##*.}"
version="$((minor_part / 100)).$((minor_part % 100)).$patch"

recipe=2 # 2: without the discovery providers (remove_all_sd)
pins_hash="$( (echo "recipe=$recipe"; cat "$wrapper/go.mod" "$wrapper/go.sum") | sha256sum | cut -c1-12)"
cache_root="${X402_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/x402-fleet}"
out="$cache_root/prometheus-$version-$pins_hash"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi
complete() { [[ -f "$out/.complete" ]]; }
if complete; then echo "$out"; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build-prometheus.lock"
flock 9
if complete; then echo "$out"; exit 0; fi

go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { echo "Go is needed to build Prometheus (or set PROMETHEUS_BIN_DIR)" >&2; exit 1; }
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
ldflags="-s -w -X github.com/prometheus/common/version.Version=$version"
for cmd in prometheus promtool; do
  echo "prometheus: building $cmd $version" >&2
  # remove_all_sd (Prometheus 3.10+): none of the bundled service-discovery providers (cloud SDKs,
  # Kubernetes, Consul...): the suites scrape static targets, and the build is far smaller
  (cd "$wrapper" && nice -n 19 "$go" build -p 2 -tags remove_all_sd -ldflags "$ldflags" -o "$tmp/$cmd" "github.com/prometheus/prometheus/cmd/$cmd")
done
printf 'prometheus=%s\nbuild_seconds=%s\n' "$version" "$(( $(date +%s) - start ))" > "$tmp/VERSIONS"
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "prometheus: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
