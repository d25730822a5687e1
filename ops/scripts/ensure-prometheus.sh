#!/usr/bin/env bash
# Make sure a Prometheus server binary is on this machine (the dashboard test runs its PromQL).
# Installs the Debian package if it is missing; never starts the system service: each test
# starts its own Prometheus on a free loopback port and ends it.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus not found and apt-get is unavailable: install Prometheus >= 2.x by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
# Keep the package's postinst from starting a system-wide prometheus on :9090.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  trap '$SUDO rm -f "$POLICY"' EXIT
fi
echo "prometheus not found: installing it with apt-get" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]
