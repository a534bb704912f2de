# Device run (issue #45): the single-pair proxy against direct with larger credit everywhere:
# the fedgate primary's grant, the proxy node's credit_window, and the C receiver's credit.
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.." || exit 1
source bench/device/setup.sh > $OUT/setup.log 2>&1
cat $OUT/setup.log
T0=$(date +%s)
for v in "16000 4000 4000" "16000 16000 16000"; do set -- $v
  timeout 100 python3 bench/proxy.py --primaries fedgate --pairs 1 --skip-idle --layouts shared --rounds 3 --messages ${PX_MSGS:-200000} --primary-credit $1 --node-credit $2 --credit $3 --output /tmp/px-$1-$2-$3.json > /tmp/px.log 2>&1
  echo "proxy primary $1 node $2 receiver $3: exit $?"; python3 - /tmp/px-$1-$2-$3.json <<'PY'
import json,sys
try: b=json.load(open(sys.argv[1]))
except Exception as e: print("no result", e); sys.exit()
for r in b["throughput"]["runs"]:
    print(r["target"], r["round"], r["msgs_per_s"], "node", r["node_cpu_us_per_msg"], "primary", r["primary_cpu_us_per_msg"], "busy", r["cpu_busy"])
for k,c in b["throughput"]["cases"].items(): print(k, c.get("ratio"), c.get("proxy",{}).get("msgs_per_s"), c.get("direct",{}).get("msgs_per_s"))
PY
  cp /tmp/px-$1-$2-$3.json $OUT/
done
echo "all done after $(( $(date +%s) - T0 )) s"
