#!/usr/bin/env bash
# `make image`: build the Dockerfile with buildah as IMAGE (default: the chart's image at the
# package's version). No registry can be reached here, so the Dockerfile's base (Debian
# bookworm, as debian:bookworm-slim) is bootstrapped from Debian's packages with mmdebstrap
# once and kept in the local image store as BASE; the Dockerfile's steps then run as written
# (apt-get, the venv, the wheel of this checkout). REINS_IMAGE_NEW_BASE=1 bootstraps it again.
# Prints the image's name, size and the seconds the build took.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
: "${IMAGE:?IMAGE is the name to tag, e.g. ghcr.io/reins/reins:0.2.0}"
BASE="${BASE:-localhost/reins-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org}"
started=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Each tool's output goes to a log, shown when it fails.
quietly() {
  "$@" >"$work/log" 2>&1 || { tail -n 60 "$work/log" >&2; echo "failed: $1" >&2; exit 1; }
}

if [ "${REINS_IMAGE_NEW_BASE:-0}" = 1 ] || ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  echo "bootstrapping $BASE (Debian bookworm, minbase) with mmdebstrap" >&2
  # As debian:bookworm-slim: no documentation, manuals or translations, in the base and in
  # every package the Dockerfile installs on it (dpkg's path-exclude stays in the image).
  # The merged-usr hook lays out /usr as bookworm does without the usrmerge package (and perl).
  quietly mmdebstrap --variant=minbase \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    bookworm "$work/base.tar" \
    "deb $MIRROR/debian bookworm main" \
    "deb $MIRROR/debian bookworm-updates main" \
    "deb $MIRROR/debian-security bookworm-security main"
  buildah rmi "$BASE" >/dev/null 2>&1 || true
  podman import --quiet --change 'CMD ["/bin/bash"]' "$work/base.tar" "$BASE" >/dev/null
fi

# Where this machine reaches PyPI through a TLS-inspecting proxy, pip in the build steps needs
# its CA bundle: the build secret pip-ca, mounted for the pip steps alone (never in a layer).
ca_args=()
ca="${PIP_CERT:-${SSL_CERT_FILE:-}}"
if [ -n "$ca" ] && [ -f "$ca" ]; then
  ca_args=(--secret "id=pip-ca,src=$ca")
fi

previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)

# chroot isolation: each RUN step runs in a chroot of the layer, on the host's network (no OCI
# runtime, which this machine's sandbox limits; see ops/scripts/ensure-image-tools.sh).
quietly buildah build --layers --isolation chroot --pull=never \
  --build-arg "BASE=$BASE" "${ca_args[@]}" -f Dockerfile -t "$IMAGE" .
# The image this build replaced under the same name, if any (the layer cache stays).
current=$(podman image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "built $IMAGE: $((size / 1000000)) MB in $(($(date +%s) - started)) s"
