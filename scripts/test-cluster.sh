#!/usr/bin/env bash
# Runs the cluster suites locally as CI does: builds (or finds cached) the control plane, a real
# node's parts and its NetworkPolicy engine, Prometheus and the image, then runs every suite that
# uses them with CI=true, so a missing piece fails instead of skipping. Needs root and Go (see README, "Tests").
# Usage: scripts/test-cluster.sh [vitest arguments, e.g. -t 'real node']
set -euo pipefail
cd "$(dirname "$0")/.."
for build in control-plane node network-policies prometheus image; do
  echo "cluster suites: scripts/build-$build.sh" >&2
  bash "scripts/build-$build.sh" >/dev/null
done
mapfile -t suites < <(grep -lE 'helpers/(control-plane|node|network-policy|image|prometheus)\.ts' test/*.test.ts | sort)
echo "cluster suites: ${suites[*]}" >&2
CI=true exec npx vitest run "${suites[@]}" "$@"
