#!/usr/bin/env bash
# Install the Node.js dependencies of the rhea interop clients (tests/js).
#
# Idempotent: runs `npm ci` only when tests/js/node_modules is missing or
# older than package-lock.json / package.json. Exits non-zero on failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${here}/../.." && pwd)"
js_dir="${repo_root}/tests/js"
stamp="${js_dir}/node_modules/.fedgate-npm-ci.stamp"

for tool in node npm; do
    if ! command -v "${tool}" >/dev/null 2>&1; then
        echo "npm.sh: '${tool}' not found on PATH (Node.js >= 18 required)" >&2
        exit 1
    fi
done

if [[ ! -f "${js_dir}/package-lock.json" ]]; then
    echo "npm.sh: ${js_dir}/package-lock.json is missing" >&2
    exit 1
fi

needs_install=0
if [[ ! -f "${stamp}" || ! -f "${js_dir}/node_modules/rhea/package.json" ]]; then
    needs_install=1
elif [[ "${js_dir}/package-lock.json" -nt "${stamp}" || "${js_dir}/package.json" -nt "${stamp}" ]]; then
    needs_install=1
fi

if [[ "${needs_install}" -eq 0 ]]; then
    echo "npm.sh: tests/js/node_modules is up to date"
    exit 0
fi

echo "npm.sh: running npm ci in tests/js"
(cd "${js_dir}" && npm ci --no-audit --no-fund)
# Sanity check: the clients must be able to load rhea.
(cd "${js_dir}" && node -e "require('rhea')")
touch "${stamp}"
echo "npm.sh: installed rhea $(cd "${js_dir}" && node -p "require('rhea/package.json').version")"
