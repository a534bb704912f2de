# Device run 1 (issue #45): the 16-core table on the current code, and the proxy row's variants.
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
source bench/device/setup.sh > $OUT/setup.log 2>&1
cat $OUT/setup.log
(nproc; python3 --version; uptime) >> $OUT/setup.log
T0=$(date +%s)
timeout 300 python3 bench/many_core.py --rounds ${ROUNDS:-4} --messages 400000 --results /tmp/mc $MC_EXTRA > $OUT/table.log 2>&1
echo "table exit $? after $(( $(date +%s) - T0 )) s"; tail -12 $OUT/table.log
cp /tmp/mc/replicated.json /tmp/mc/table.json /tmp/mc/proxy.json $OUT/ 2>/dev/null
cp /tmp/mc/local.json $OUT/local.json 2>/dev/null
for v in "split 1000" "shared 10000"; do set -- $v
  timeout 120 python3 bench/proxy.py --primaries fedgate --pairs 1 --skip-idle --layouts $1 --rounds 3 --messages ${PX_MSGS:-200000} --credit $2 --output /tmp/px-$1-$2.json > /tmp/px.log 2>&1
  echo "proxy $1 credit $2 exit $?"; python3 - /tmp/px-$1-$2.json <<'PY'
import json,sys
try: b=json.load(open(sys.argv[1]))
except Exception as e: print("no result", e); sys.exit()
for r in b["throughput"]["runs"]:
    print(r["target"], r["round"], r["msgs_per_s"], "node", r["node_cpu_us_per_msg"], "primary", r["primary_cpu_us_per_msg"], "busy", r["cpu_busy"])
for k,c in b["throughput"]["cases"].items(): print(k, c.get("ratio"))
PY
done
echo "all done after $(( $(date +%s) - T0 )) s"
