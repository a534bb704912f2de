#!/usr/bin/env bash
# Debian's chromium for the admin console test (driven by playwright-core from
# npm; playwright never downloads a browser). Idempotent: a no-op when installed.
set -euo pipefail
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed" \
    && [ -x /usr/bin/chromium ]; then
  echo "chromium.sh: chromium is installed ($(dpkg-query -W -f='${Version}' chromium))"
  exit 0
fi
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
echo "chromium.sh: installing Debian's chromium"
export DEBIAN_FRONTEND=noninteractive
if ! as_root apt-get install -y chromium >/tmp/chromium-apt.log 2>&1; then
  as_root apt-get update -qq
  as_root apt-get install -y chromium >/tmp/chromium-apt.log 2>&1 \
    || { tail -20 /tmp/chromium-apt.log >&2; echo "chromium.sh: apt-get install chromium failed" >&2; exit 1; }
fi
echo "chromium.sh: installed $(dpkg-query -W -f='${Version}' chromium)"
