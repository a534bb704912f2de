#!/usr/bin/env bash
# Debian packages for the DMZ tests (idempotent): openssl makes throwaway
# certificates (tests/certs.py); systemd's systemd-analyze verifies the unit
# in deploy/systemd/.
set -euo pipefail
missing=()
command -v openssl >/dev/null || missing+=(openssl)
command -v systemd-analyze >/dev/null || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
