# Device setup (sourced from the repo root on the lent machine): packages, C clients, fastpath.
D=$PWD/.devbundle  # made by bench/device/make-bundle.sh
PY=${PY:-python3}
WHL=${WHL:-$D/whl}
rm -rf /tmp/site && mkdir -p /tmp/site
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHL/*.whl || echo "PIP FAILED"
cp -r $D/site/* /tmp/site/
export PYTHONPATH=/tmp/site:$PWD
export LD_LIBRARY_PATH=$D/lib
mkdir -p .build/bench && cp $D/bin/send $D/bin/receive .build/bench/
EXT=$($PY -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
INC=$($PY -c "import sysconfig;print(sysconfig.get_paths()['include'])")
gcc -O2 -shared -fPIC -I"$INC" proxy/amqp/_fastpath.c -o proxy/amqp/_fastpath$EXT 2>/tmp/gcc.err || { echo "NO FASTPATH"; head -5 /tmp/gcc.err; }
mkdir -p .venv/bin
printf '#!/bin/sh\nexec %s -c "import sys; from proxy.cli import main; sys.exit(main())" "$@"\n' "$(command -v $PY)" > .venv/bin/fedgate
chmod +x .venv/bin/fedgate
$PY -c "import proton, orjson, uhashring, aiohttp, proxy.amqp.fastpath as f; from importlib.metadata import entry_points as e; print('setup ok', proton.VERSION, [x.name for x in e(group='fedgate.services')], getattr(f,'AVAILABLE',None))"
nproc
