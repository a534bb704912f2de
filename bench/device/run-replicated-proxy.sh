# Device run 2 (issue #45): the replicated row again (6 rounds), and the single-pair proxy
# against direct with the fedgate primary's producer credit 1000 / 4000 / 16000.
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
source bench/device/setup.sh > $OUT/setup.log 2>&1
cat $OUT/setup.log; ls proxy/amqp/*.so
T0=$(date +%s)
timeout 200 python3 bench/scale.py --kinds replicated --workers 1,8 --pairs 16 --messages 400000 --rounds ${ROUNDS:-6} --output /tmp/replicated.json > $OUT/replicated.log 2>&1
echo "replicated exit $? after $(( $(date +%s) - T0 )) s"; grep "round\|replicated-" $OUT/replicated.log
cp /tmp/replicated.json $OUT/
for pc in 1000 4000 16000; do
  timeout 100 python3 bench/proxy.py --primaries fedgate --pairs 1 --skip-idle --layouts shared --rounds 3 --messages ${PX_MSGS:-200000} --primary-credit $pc --output /tmp/px-$pc.json > /tmp/px.log 2>&1
  echo "proxy primary credit $pc exit $?"; python3 - /tmp/px-$pc.json <<'PY'
import json,sys
try: b=json.load(open(sys.argv[1]))
except Exception as e: print("no result", e); sys.exit()
for r in b["throughput"]["runs"]:
    print(r["target"], r["round"], r["msgs_per_s"], "node", r["node_cpu_us_per_msg"], "primary", r["primary_cpu_us_per_msg"], "busy", r["cpu_busy"])
for k,c in b["throughput"]["cases"].items(): print(k, c.get("ratio"), c.get("proxy",{}).get("msgs_per_s"), c.get("direct",{}).get("msgs_per_s"))
PY
  cp /tmp/px-$pc.json $OUT/
done
echo "all done after $(( $(date +%s) - T0 )) s"
