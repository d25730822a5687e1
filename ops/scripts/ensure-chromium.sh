#!/usr/bin/env bash
# Make sure a headless Chromium and its WebDriver are on this machine (the console's browser
# tests drive them with Selenium). Installs Debian's packages if either is missing; nothing is
# downloaded from anywhere else, and nothing is started here: each test starts its own browser.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium or chromedriver not found and apt-get is unavailable: install Chromium and" \
    "its matching chromedriver by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "chromium or chromedriver not found: installing them with apt-get" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver fonts-dejavu-core >/dev/null
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
