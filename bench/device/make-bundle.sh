#!/usr/bin/env bash
# The 16-core runs on the `device` tool's machine (issue #45): it has Python 3.12 (aiohttp
# among its packages), gcc, and no network. This makes .devbundle/ (git-ignored; carry it:
# `carry: [".devbundle"]`) from this machine's set-up (make venv; .ci/install/c-clients.sh):
#   whl/   cp312 wheels of what the image lacks (orjson, websockets, cffi, ...)
#   site/  python-qpid-proton's package as installed here (its cffi module is abi3) and
#          fedgate's dist-info (the entry points of its services)
#   lib/   libqpid-proton.so.11 for the C clients;  bin/  the quiet C send and receive
# Then, there: `bash bench/device/run-table.sh` (every row of bench/many_core.py, then the
# proxy row's variants) or `bash bench/device/run-replicated-proxy.sh`; each sources
# bench/device/setup.sh (installs into /tmp/site, builds the C fast path for 3.12, writes
# .venv/bin/fedgate) and leaves its results in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=.devbundle; S=.venv/lib/python3.11/site-packages
rm -rf $B && mkdir -p $B/whl $B/site/fedgate-0.6.0.dist-info $B/lib $B/bin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d $B/whl orjson uhashring websockets aetcd PyJWT cffi pycparser cryptography
cp -r $S/proton $S/cproton.py $S/cproton_ffi.abi3.so $B/site/
cp $S/fedgate-*.dist-info/{METADATA,entry_points.txt,top_level.txt} $B/site/fedgate-0.6.0.dist-info/
find $B/site -name __pycache__ -prune -exec rm -rf {} +
cp -L /lib/x86_64-linux-gnu/libqpid-proton.so.11 $B/lib/
cp .build/bench/send .build/bench/receive $B/bin/
cp bench/device/setup.sh $B/setup.sh
du -sh $B
