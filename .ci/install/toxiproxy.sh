#!/usr/bin/env bash
# Build the real Toxiproxy server (Shopify's fault-injecting TCP proxy) for the
# fault tests (tests/toxi.py), pinned, into .tools/bin/toxiproxy-server.
#
# Idempotent: when the binary is there and reports the pinned version, nothing
# is done (a few ms). Go's module cache, build cache and GOBIN all live under
# .tools/ (git-ignored), so nothing lands in $HOME that a CI machine would
# lack. Needs a Go toolchain (preinstalled on the project's machines; else
# Debian's golang-go is installed, and Go fetches the toolchain the module
# asks for from the Go module proxy).
#
# Usage: bash .ci/install/toxiproxy.sh
set -euo pipefail

VERSION=v2.12.0   # go list -m -versions github.com/Shopify/toxiproxy/v2
MODULE=github.com/Shopify/toxiproxy/v2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOLS=$ROOT/.tools
BIN=$TOOLS/bin/toxiproxy-server

log() { echo "[toxiproxy.sh] $*" >&2; }
die() { echo "[toxiproxy.sh] ERROR: $*" >&2; exit 1; }

if [ -x "$BIN" ] && "$BIN" -version 2>/dev/null | grep -q "${VERSION#v}"; then
    exit 0
fi

GO=$(command -v go || true)
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; } || true
if [ -z "$GO" ]; then
    log "no Go toolchain: installing Debian's golang-go"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends golang-go ca-certificates >/dev/null
    GO=$(command -v go) || die "go still not found after installing golang-go"
fi

mkdir -p "$TOOLS/bin" "$TOOLS/go" "$TOOLS/go-cache"
BUILD=$(mktemp -d "$TOOLS/toxiproxy-build.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT
log "building $MODULE/cmd/server@$VERSION with $("$GO" version)"
# GOFLAGS=-modcacherw: the module cache stays deletable (make clean, rm -rf .tools)
env GOBIN="$BUILD" GOPATH="$TOOLS/go" GOMODCACHE="$TOOLS/go/pkg/mod" GOCACHE="$TOOLS/go-cache" \
    GOFLAGS=-modcacherw GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    timeout 900 "$GO" install -ldflags "-X $MODULE.Version=${VERSION#v}" "$MODULE/cmd/server@$VERSION" \
    || die "go install $MODULE/cmd/server@$VERSION failed"
mv -f "$BUILD/server" "$BIN"
"$BIN" -version | grep -q "${VERSION#v}" || die "$BIN does not report version $VERSION"
log "installed $BIN ($("$BIN" -version 2>&1 | head -1))"
