#!/usr/bin/env bash
# The tools `make image` and its test use, from Debian's packages: mmdebstrap (the base file
# system, bootstrapped from Debian since no registry can be reached), buildah (builds the
# Dockerfile), podman and runc (run the image; crun, podman's default here, cannot start a
# container on this machine's hybrid cgroup v1/v2 mounts, runc can). Skips what is present.
set -euo pipefail
missing=()
for tool in mmdebstrap buildah podman runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "installing ${missing[*]} with apt-get" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
