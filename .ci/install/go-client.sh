#!/usr/bin/env bash
# Build the go-amqp test client (tests/clients/goamqp) into .build/goamqp-client.
#
# go-amqp (github.com/Azure/go-amqp, pinned in go.mod / go.sum) is fetched by the
# Go toolchain from the Go module proxy. Idempotent: rebuilds only when a source
# file is newer than the binary. Exits non-zero on failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${here}/../.." && pwd)"
src="${repo_root}/tests/clients/goamqp"
out="${repo_root}/.build/goamqp-client"

go_bin="$(command -v go || true)"
if [[ -z "${go_bin}" && -x /usr/local/go/bin/go ]]; then
    go_bin=/usr/local/go/bin/go
fi
if [[ -z "${go_bin}" ]]; then
    echo "go-client.sh: the Go toolchain (go) is not installed" >&2
    exit 1
fi

if [[ -x "${out}" ]] && [[ -z "$(find "${src}" -newer "${out}" -type f | head -1)" ]]; then
    echo "go-client.sh: .build/goamqp-client is up to date"
    exit 0
fi

echo "go-client.sh: building tests/clients/goamqp with $("${go_bin}" version)"
mkdir -p "$(dirname "${out}")"
(cd "${src}" && "${go_bin}" build -trimpath -o "${out}" .)
echo "go-client.sh: built .build/goamqp-client"
