#!/usr/bin/env bash
# Debian packages the project needs to build and test (idempotent).
# python-qpid-proton builds from source: gcc, python3-dev, libssl-dev.
set -euo pipefail
packages=(gcc python3-dev libssl-dev pkg-config nodejs npm)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# node/npm may come from elsewhere than Debian: accept them on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for pkg in "${missing[@]}"; do [[ "$pkg" == nodejs || "$pkg" == npm ]] || filtered+=("$pkg"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi
