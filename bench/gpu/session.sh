#!/usr/bin/env bash
# One device call that does a session's GPU work in steps, everything it writes coming back as one archive
# ($OUT/results.tgz: the call may return 8 files at most). Prepared here (bench/gpu/prepare.sh, and for the
# candidate steps docs/gpu.md "Restricted-SM candidates"); on the GPU machine:
#   device call: carry [".devkit", ".gpu"], command "bash bench/gpu/session.sh STEP...", timeout_s 600
# Steps, run in the order given, each bounded; all within SESSION_BUDGET_S seconds (default 480):
#   kits        measure every carried kit ($dir/kit-*/) at every SM count the device's green contexts allow
#               (tvmsched tune measure): the GPU round behind restricted-SM candidates (issue 30)
#   suite       bench/gpu/suite.sh (kernels against PyTorch, then the sharing sections within SHARING_S) in what
#               is left less RESERVE_S (default 0) seconds kept for the steps after it; SUITE_ARGS go to suite.py
#   colocation  bench/colocation.py on each mix of .gpu/mixes.txt (lines "NAME QOS_MS_LIST ARTIFACT..."; artifacts
#               with restricted-SM candidates), all policies, then colocation and partition again with
#               TVMSCHED_SM_WINDOWS=prefix (every k-SM context on the same first k SMs, as before sm_windows.h)
#   sharing     bench/gpu/sharing.sh on the artifacts of $dir/work/ (carried slim) alone, SHARING_SECTIONS of them
#   bandwidth   pinned host <-> device copy bandwidth, both directions (bench/gpu/bandwidth.py)
#   profile     tvmsched profile-coloc of each mix's artifacts into .gpu/coloc-MIX.json, used by a later colocation
#   plan        docs/gpu.md's ordered GPU plan: its steps from PLAN_FROM (default 1) in order, each only when its time
#               budget (PLAN_BUDGETS) still fits in what is left; the first that does not fit is where the next call
#               resumes ($res/plan-next.txt says "PLAN_FROM=N"). PLAN_DRY=1 prints the schedule and runs nothing.
#                 1 switching table + loop checks (flag in device memory)     sharing sections switching, loops
#                 2 preemption: RT mix at loads 0.2/0.5/0.8, two RT streams   sharing sections preemption, rtstreams
#                 3 fp16 rows: resnet50, bert-base at batch 8 (and fp32 b8)   suite --models resnet50 bert-base
#                 4 resnet50 kit at KIT_UNITS SM counts, resnet50 tiering     kits, sharing section tiering
#                 5 colocation on the mixes (candidates compiled here from    profile, colocation
#                   step 4's measurements: a call of its own)
#                 6 batching against none (bench/batching.py --device cuda)   artifacts carried in $dir/batching/
set -uo pipefail
start=$SECONDS
cd "$(dirname "$0")/../.."
budget=${SESSION_BUDGET_S:-480}
dir=${SESSION_DIR:-.gpu}        # on this machine, a CPU twin: SESSION_DIR=DIR SESSION_DEVICE=cpu (kits and mixes for llvm)
device=${SESSION_DEVICE:-cuda}
if [ "$device" != cpu ]; then  # the CPU twin runs in this machine's environment
  if [ ! -f .devkit/activate.sh ]; then
    echo "error: .devkit/ is missing: run 'bash bench/gpu/prepare.sh' where TVM is and carry [\".devkit\", \".gpu\"]" >&2
    exit 2
  fi
  source .devkit/activate.sh || { echo "error: installing the kit failed" >&2; exit 2; }
fi
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1 PYTHONUNBUFFERED=1
final=${OUT:-}
res=$(mktemp -d)
left() { echo $(( budget - (SECONDS - start) )); }
log() { echo "[$(( SECONDS - start )) s] $*" | tee -a "$res/session.log"; }
[ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,persistence_mode --format=csv > "$res/gpu.csv" 2>&1

step_kits() {
  for kit in $dir/kit-*/; do
    [ -f "$kit/kit.json" ] || continue
    local name share
    name=$(basename "$kit")
    share=$(( $(left) / 4 ))
    (( share > 60 )) && share=60
    local units=()  # KIT_UNITS=24,48,72,96,132: fewer SM counts (a 293-kernel resnet50 kit at all 17 took > 60 s)
    [ -n "${KIT_UNITS:-}" ] && units=(--units "$KIT_UNITS")
    timeout -k 5 "$share" python3 -P -m tvmsched.cli tune measure "$kit" -o "$res/$name.json" "${units[@]}" \
      > "$res/$name.log" 2>&1
    log "kits: $name exit $? ($(tr '\r' '\n' < "$res/$name.log" | tail -1))"
  done
}

step_suite() {
  local suite_budget=$(( $(left) - ${RESERVE_S:-0} ))
  # shellcheck disable=SC2086
  OUT="$res" SUITE_BUDGET_S=$suite_budget bash bench/gpu/suite.sh ${SUITE_ARGS:-} > "$res/suite.log" 2>&1
  log "suite: exit $? ($(tail -1 "$res/suite.log"))"
}

# artifacts carried slim ($dir/*/NAME.tvms.slim, bench/gpu/slim.py pack): restored beside themselves once
unslim() {
  local f
  for f in "$dir"/*/*.tvms.slim; do
    [ -f "$f" ] && [ ! -f "${f%.slim}" ] || continue
    python3 -P bench/gpu/slim.py unpack "$f" "${f%.slim}" > /dev/null 2>> "$res/unslim.log" || log "unslim: $f failed"
  done
}

# coloc_run MIX SECONDS PLACEMENT QOS ARTIFACTS RATES [ARGS...]: one bench/colocation.py run of a mix; PLACEMENT
# "prefix" runs it with TVMSCHED_SM_WINDOWS=prefix (every k-SM green context on the first k SMs) into *-prefix.*
coloc_run() {
  local name=$1 seconds=$2 placement=$3 qos=$4 artifacts=$5 rates=$6 stem
  shift 6
  stem=colocation-$name${placement:+-$placement}
  # shellcheck disable=SC2086
  TVMSCHED_SM_WINDOWS=${placement:-windows} timeout -k 5 "$seconds" python3 -P bench/colocation.py --device "$device" \
    --artifacts $artifacts --qos-ms ${qos//,/ } $rates "$@" --out "$res/$stem.json" > "$res/$stem.log" 2>&1
  log "colocation $name${placement:+ (SM $placement)}: exit $? ($(tail -1 "$res/$stem.log"))"
}

step_colocation() {
  [ -f "$dir/mixes.txt" ] || { log "colocation: no $dir/mixes.txt"; return; }
  unslim
  local lines name qos artifacts db share
  lines=$(grep -cv "^#" "$dir/mixes.txt")
  while read -r name qos artifacts; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    db=$dir/coloc-$name.json
    local var="COLOC_ARGS_$name" rates  # per mix (COLOC_ARGS_small=...), else COLOC_ARGS, else the default
    rates=${!var:-${COLOC_ARGS:---rates 500 1000 2000 4000 --seconds 1.5 --search 2}}
    share=$(( $(left) / (lines > 0 ? lines : 1) ))
    lines=$(( lines - 1 ))
    local coloc=()
    [ -f "$db" ] && coloc=(--colocation "$(realpath "$db")")
    coloc_run "$name" $(( share * 2 / 3 )) "" "$qos" "$artifacts" "$rates" "${coloc[@]}"
    coloc_run "$name" $(( share / 3 )) prefix "$qos" "$artifacts" "$rates" --policies colocation partition "${coloc[@]}"
  done < "$dir/mixes.txt"
}

step_sharing() {
  unslim
  bash bench/gpu/sharing.sh "$dir/work" "$device" "${SHARING_S:-$(( $(left) - ${RESERVE_S:-0} ))}" > "$res/sharing.log" 2>&1
  cp bench/results/gpu-sharing.md "$res/gpu-sharing-2.md" 2>/dev/null
  cp bench/results/raw/sharing-*.json "$res/" 2>/dev/null
  log "sharing: exit $? ($(tail -1 "$res/sharing.log"))"
}

step_bandwidth() {
  timeout -k 5 30 python3 -P bench/gpu/bandwidth.py --out "$res/bandwidth.json" > "$res/bandwidth.log" 2>&1
  log "bandwidth: exit $? ($(tail -1 "$res/bandwidth.log"))"
}

step_profile() {
  [ -f "$dir/mixes.txt" ] || { log "profile: no $dir/mixes.txt"; return; }
  unslim
  local name qos artifacts
  while read -r name qos artifacts; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    # shellcheck disable=SC2086
    # --no-store: the JSON alone (the kit has no SQLAlchemy); the colocation step reads it
    timeout -k 5 60 python3 -P -m tvmsched.cli profile-coloc $artifacts --device $device --seconds ${PROFILE_S:-0.1} \
      --no-store --out "$dir/coloc-$name.json" > "$res/profile-$name.log" 2>&1
    log "profile $name: exit $? ($(tail -1 "$res/profile-$name.log"))"
  done < "$dir/mixes.txt"
}

# the plan's steps (docs/gpu.md, "The GPU plan"); plan_N SECONDS runs step N within SECONDS
PLAN_NAMES=("" "switching and loop checks" "preemption" "fp16 rows" "resnet50 kit and tiering" "colocation" "batching")
read -r -a PLAN_BUDGETS <<< "0 ${PLAN_BUDGETS:-170 110 230 150 200 150}"
within() {  # within SECONDS COMMAND...: COMMAND's steps see only SECONDS left
  local saved=$budget
  budget=$(( SECONDS - start + $1 ))
  shift
  "$@"
  budget=$saved
}
plan_1() { SHARING_SECTIONS="switching loops" SHARING_S=$1 step_sharing; }
plan_2() { SHARING_SECTIONS="preemption rtstreams" SHARING_S=$1 step_sharing; }
plan_3() {  # the rows prepare.py --rows resnet50:fp16@8 bert-base:fp16@8 resnet50:fp32@8 bert-base:fp32@8 carried
  # shellcheck disable=SC2086
  timeout -k 5 "$1" python3 -P bench/gpu/suite.py --artifacts "$dir" --device "$device" --work "$res/suite-work" \
    --models ${PLAN_SUITE_MODELS:-resnet50 bert-base} --compile-backend none --budget-s $(( $1 - 10 )) \
    --out "$res/gpu-fp16.md" > "$res/suite-fp16.log" 2>&1
  log "fp16 rows: exit $? ($(tail -1 "$res/suite-fp16.log"))"
  rm -rf "$res/suite-work"
}
plan_4() {
  KIT_UNITS=${KIT_UNITS:-24,48,72,96,132} within $(( $1 * 2 / 3 )) step_kits
  SHARING_SECTIONS=tiering SHARING_S=$(( $1 / 3 )) step_sharing
}
plan_5() { within $(( $1 / 4 )) step_profile; within $(( $1 * 3 / 4 )) step_colocation; }
plan_6() {
  [ -d "$dir/batching" ] || { log "batching: no $dir/batching/ (artifacts MODEL-bnone.tvms, MODEL-b1-2-4-8.tvms)"; return; }
  timeout -k 5 "$1" python3 -P bench/batching.py --device "$device" --work "$dir/batching" --no-serve \
    --models "${BATCHING_MODELS:-resnet18-small:1/2/4/8,bert-tiny:1/2/4}" --seconds 1 --out "$res/batching.json" \
    > "$res/batching.log" 2>&1
  log "batching: exit $? ($(tail -1 "$res/batching.log"))"
}

step_plan() {
  local n=${PLAN_FROM:-1} need
  while (( n < ${#PLAN_BUDGETS[@]} )); do
    need=${PLAN_BUDGETS[$n]}
    if (( n == 5 )) && [ ! -f "$dir/mixes.txt" ]; then
      log "plan: step 5 needs $dir/mixes.txt, the mixes of candidates compiled here from step 4's kit measurements"
      break
    fi
    if (( need > $(left) )); then
      log "plan: step $n (${PLAN_NAMES[$n]}) needs $need s, $(left) s left"
      break
    fi
    log "plan: step $n (${PLAN_NAMES[$n]}) within $need s"
    if [ -n "${PLAN_DRY:-}" ]; then budget=$(( budget - need )); else "plan_$n" "$need"; fi
    n=$(( n + 1 ))
  done
  echo "PLAN_FROM=$n" > "$res/plan-next.txt"
  if (( n >= ${#PLAN_BUDGETS[@]} )); then log "plan: every step done"; else log "plan: the next call resumes with PLAN_FROM=$n"; fi
}

for step in "$@"; do
  case $step in
    kits | suite | colocation | profile | bandwidth | sharing | plan) log "$step: start, $(left) s left"; "step_$step" ;;
    *) echo "error: unknown step '$step' (kits, suite, sharing, bandwidth, colocation, profile, plan)" >&2; exit 2 ;;
  esac
done
cp "$dir"/coloc-*.json "$res/" 2>/dev/null
log "session: done"
if [ -n "$final" ]; then tar -C "$res" -czf "$final/results.tgz" . && ls -la "$final"; fi
