#!/usr/bin/env bash
# Builds what a real Kubernetes node needs here, beside the control plane of
# scripts/build-control-plane.sh (same pinned Kubernetes, same Go module and build caches):
#   - kubelet and kube-proxy from the pinned module (scripts/node/go.{mod,sum}: the control plane's
#     pins plus the node-only packages; only those files are committed, never binaries);
#   - CoreDNS (cluster DNS) from its Go module: scripts/node/coredns, upstream's main with only the
#     plugins a cluster Corefile uses (no cloud SDKs), its Kubernetes client raised to the node's pins;
#   - the pause image: pause.c from the same module's source (build/pause/linux), compiled static
#     as the upstream Makefile does, made into an OCI archive by hand (no registry, no builder):
#     localhost/x402-fleet-pause:<upstream tag>;
#   - containerd, runc, the CNI plugins and nft (kube-proxy's nftables mode) from Debian's packages
#     when missing (needs root).
# test/helpers/node.ts starts containerd and a kubelet from these and registers a real node; with
# services, kube-proxy and CoreDNS too.
#
# Output: a version-keyed directory outside the clone, printed on stdout as the last line:
#   ${X402_FLEET_CACHE:-~/.cache/x402-fleet}/node-<kubernetes version>-<hash of the pins>/
# holding kubelet, kube-proxy, coredns, pause.oci.tar, VERSIONS. A second run is a stat. It takes the
# control plane's build lock: on a cold machine the two builds share the caches, never the cores.
#
# Usage: scripts/build-node.sh [--print-dir]   (--print-dir: no build, just the path)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
wrapper="$here/node"

k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$wrapper/go.mod")"
cp_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$here/control-plane/kubernetes/go.mod")"
[[ -n "$k8s_version" ]] || { echo "cannot read the pinned Kubernetes version from $wrapper/go.mod" >&2; exit 1; }
# A node newer than its control plane is unsupported (version skew): both pins move together.
[[ "$k8s_version" == "$cp_version" ]] || { echo "node pins Kubernetes $k8s_version, the control plane $cp_version: keep them equal" >&2; exit 1; }

recipe=1
pins_hash="$( (echo "recipe=$recipe"; cat "$wrapper/go.mod" "$wrapper/go.sum" "$wrapper/coredns/go.mod" "$wrapper/coredns/go.sum" "$wrapper/coredns/main.go"; sed -n '/^# ---- build/,$p' "$0") | sha256sum | cut -c1-12)"
cache_root="${X402_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/x402-fleet}"
out="$cache_root/node-$k8s_version-$pins_hash"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi
host_tools_present() { command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null && [[ -x /usr/lib/cni/bridge ]] && command -v nft >/dev/null; }
complete() { [[ -f "$out/.complete" ]] && host_tools_present; }
if complete; then echo "$out"; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9 # a control-plane or node build may be running: wait for it, then reuse its result
if complete; then echo "$out"; exit 0; fi

# ---- build --------------------------------------------------------------------------------------
start=$(date +%s)
if ! host_tools_present; then
  [[ $EUID -eq 0 ]] || { echo "node: containerd, runc, the CNI plugins or nft are missing, and installing them needs root" >&2; exit 1; }
  echo "node: installing containerd, runc, containernetworking-plugins and nftables from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins nftables >"$cache_root/.apt-node.log" 2>&1 \
    || { tail -20 "$cache_root/.apt-node.log" >&2; exit 1; }
fi
if [[ -f "$out/.complete" ]]; then echo "$out"; exit 0; fi

go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { echo "Go is needed to build the node components" >&2; exit 1; }
command -v cc >/dev/null || { echo "a C compiler is needed for the pause program (Debian: gcc, libc6-dev)" >&2; exit 1; }

# As the control plane: static, reproducible, offline after the download; nice and -p 2 on a shared machine.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

minor="${k8s_version#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for cmd in kubelet kube-proxy; do
  echo "node: building $cmd (k8s.io/kubernetes/cmd/$cmd $k8s_version)" >&2
  (cd "$wrapper" && nice -n 19 "$go" build -p 2 -ldflags "$k8s_ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd")
done

coredns_version="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3; exit }' "$wrapper/coredns/go.mod")"
echo "node: building coredns (github.com/coredns/coredns $coredns_version)" >&2
(cd "$wrapper/coredns" && nice -n 19 "$go" build -p 2 -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version" -o "$tmp/coredns" .)

# The pause program, as build/pause/Makefile builds it, from the module's own source.
src="$(cd "$wrapper" && "$go" mod download -json "k8s.io/kubernetes@$k8s_version" | awk -F'"' '$2 == "Dir" { print $4 }')"
pause_tag="$(awk '$1 == "TAG" && $2 == "?=" { print $3; exit }' "$src/build/pause/Makefile")"
[[ -n "$pause_tag" && -f "$src/build/pause/linux/pause.c" ]] || { echo "no pause program in $src" >&2; exit 1; }
mkdir -p "$tmp/pause-root"
cc -Os -Wall -Werror -static -DVERSION="v$pause_tag-x402-fleet" -o "$tmp/pause-root/pause" "$src/build/pause/linux/pause.c"
strip "$tmp/pause-root/pause"
pause_image="localhost/x402-fleet-pause:$pause_tag"

# An OCI image archive of one layer (the binary), reproducible: fixed times and owners.
oci="$tmp/oci"
mkdir -p "$oci/blobs/sha256"
blob() { # <file>: moves it into the blob store, prints "<digest> <size>"
  local d; d="$(sha256sum "$1" | cut -c1-64)"
  mv "$1" "$oci/blobs/sha256/$d"
  echo "$d $(stat -c %s "$oci/blobs/sha256/$d")"
}
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp/pause-root" -cf "$tmp/layer.tar" pause
diff_id="$(sha256sum "$tmp/layer.tar" | cut -c1-64)"
gzip -n -9 "$tmp/layer.tar"
read -r layer_digest layer_size < <(blob "$tmp/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$diff_id" > "$tmp/config.json"
read -r config_digest config_size < <(blob "$tmp/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
  "$config_digest" "$config_size" "$layer_digest" "$layer_size" > "$tmp/manifest.json"
read -r manifest_digest manifest_size < <(blob "$tmp/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest_digest" "$manifest_size" "$pause_image" > "$oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$oci/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$oci" -cf "$tmp/pause.oci.tar" oci-layout index.json blobs
rm -rf "$oci" "$tmp/pause-root"

for f in kubelet kube-proxy coredns pause.oci.tar; do [[ -s "$tmp/$f" ]] || { echo "missing $f" >&2; exit 1; }; done
printf 'kubernetes=%s\ncoredns=%s\npause_image=%s\ncontainerd=%s\nrunc=%s\nbuild_seconds=%s\n' \
  "$k8s_version" "$coredns_version" "$pause_image" "$(containerd --version | awk '{print $3}')" "$(runc --version | awk 'NR == 1 {print $3}')" \
  "$(( $(date +%s) - start ))" > "$tmp/VERSIONS"
touch "$tmp/.complete"
rm -rf "$out"
mv "$tmp" "$out" # atomic: readers see no directory or a complete one
trap - EXIT
echo "node: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
