#!/bin/bash
# bench/ab.sh: two builds of distcomm side by side (OLD and NEW: target/release folders with dcrun
# and dc-bench), interleaved ABBA, medians of new/old time ratios per point. Usage:
#   OLD=/path/to/old/target/release [NEW=...] [CONDS="idle busy busy-unbound"] [SPECS="op:size:iters ..."] [RANKS="4 8"] bench/ab.sh
# Conditions: idle (2 and 4 ranks), busy (one spinning process; 2 ranks) bound and unbound
# (dcrun --bind none), busy-plain (bench/plain_launch.sh: env:// variables only, as torchrun),
# busy2 and busy2-plain (two spinning processes; dcrun's binding, or plain).
OLD=${OLD:?set OLD to the target/release folder of the old build}; NEW=${NEW:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
out=${OUT:-/tmp/ab.csv}; echo "cond,ranks,op,size,round,version,time_us" > $out
run() { # cond ranks op size iters version dcrun-args
  local d=$OLD; [ "$6" = new ] && d=$NEW
  local csv=/tmp/ab_one_$$.csv; rm -f $csv
  local launch="$d/dcrun -n $2 $7"; [[ $1 == *plain ]] && launch="$(dirname "$0")/plain_launch.sh $2"
  timeout 120 $launch $d/dc-bench -o $3 -b $4 -e $4 -n $5 -w 20 -c 1 --csv $csv >/dev/null 2>&1
  awk -F, 'NR==1{for(i=1;i<=NF;i++)if($i=="time_us")c=i} NR==2{print $c}' $csv 2>/dev/null
}
SPECS=${SPECS:-"allreduce:16:2000 allreduce:1M:100 sendrecv:256:2000 sendrecv:1M:100 barrier:0:5000"}
for cond in ${CONDS:-idle busy busy-unbound}; do
  ranks=${RANKS:-"2 4"}; [ $cond != idle ] && ranks=${RANKS:-2}
  args=""; [ $cond = busy-unbound ] && args="--bind none"
  bp=""; if [ $cond != idle ]; then sh -c 'while :; do :; done' & bp=$!; fi
  if [[ $cond == busy2* ]]; then sh -c 'while :; do :; done' & bp="$bp $!"; fi
  for n in $ranks; do for spec in $SPECS; do IFS=: read op size it <<< "$spec"
    for round in $(seq ${ROUNDS:-5}); do
      order="old new"; [ $((round % 2)) = 0 ] && order="new old"
      for v in $order; do t=$(run $cond $n $op $size $it $v "$args"); echo "$cond,$n,$op,$size,$round,$v,$t" >> $out; done
    done; done; done
  [ -n "$bp" ] && kill $bp
  wait 2>/dev/null
done
python3 - <<'PY'
import csv, statistics as st, collections
rows=list(csv.DictReader(open(__import__('os').environ.get('OUT','/tmp/ab.csv'))))
d=collections.defaultdict(dict)
for r in rows:
    try: d[(r['cond'],r['ranks'],r['op'],r['size'],r['round'])][r['version']]=float(r['time_us'])
    except: pass
agg=collections.defaultdict(list)
for k,v in d.items():
    if 'old' in v and 'new' in v and v['old']>0: agg[k[:4]].append(v['new']/v['old'])
print("cond ranks op size: median(new/old time) [n]")
for k in sorted(agg): print(*k, f"{st.median(agg[k]):.2f} [{len(agg[k])}]")
PY
