#!/usr/bin/env bash
# launch/slurm/kiln.sbatch on a real Slurm cluster (one node, CPUs only; scripts/start-slurm.sh
# starts it, as CI does): sbatch, srun --mpi=pmix, 2 ranks.
#   plain    the job trains to its last step and writes its checkpoint (the reference);
#   usr1     `scancel --batch --signal=USR1` mid-run (what the template's --signal=B:USR1@180
#            sends before the time limit; the script passes it on): every rank checkpoints and
#            exits 75, the script requeues the job, the requeued job resumes from that
#            checkpoint and ends with the reference's weights;
#   term     the same after SIGTERM to the ranks, as Slurm's preemption sends it (GraceTime).
# Fails (does not skip) when no Slurm answers: the `slurm` label needs scripts/start-slurm.sh.
source "$(dirname "$0")/../train/lib.sh"
SBATCH_TEMPLATE=$SRC/launch/slurm/kiln.sbatch
STEPS=60
JOB_LIMIT_S=150  # per job, requeue wait included

for tool in sbatch squeue scontrol scancel sinfo; do
  command -v "$tool" > /dev/null || fail "$tool not found: the slurm tests need a Slurm cluster; start one with scripts/start-slurm.sh (CI does)"
done
node_state=$(sinfo --noheader --format=%T 2>&1 | head -1) || true
case "$node_state" in
  idle* | mixed* | allocated*) ;;
  *) fail "no usable Slurm node (sinfo: ${node_state:-nothing}); start the cluster with scripts/start-slurm.sh (CI does)" ;;
esac

jobs_submitted=()
cleanup() {
  for job in "${jobs_submitted[@]}"; do scancel "$job" 2> /dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

submit() {  # name: submits the tiny experiment as a 2-rank CPU job writing to $WORK/name
  local job
  job=$(sbatch --parsable --job-name="kiln-test-$1" --ntasks-per-node=2 --chdir="$WORK" \
    --output="$WORK/$1.out" --export="ALL,KILN=$KILN" "$SBATCH_TEMPLATE" "$TINY" \
    --set train.steps=$STEPS --set checkpoint.every_steps=0 --set logging.dir="$WORK/$1" \
    ) || fail "sbatch refused the template"
  jobs_submitted+=("$job")
  echo "$job"
}

job_field() {  # job field: one field of `scontrol show job`
  scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

wait_for_job() {  # job name: waits until the job has ended for good (a requeued job comes back)
  local state start; start=$(date +%s)
  while :; do
    state=$(job_field "$1" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
    esac
    if (( $(date +%s) - start > JOB_LIMIT_S )); then
      scontrol show job "$1" >&2; cat "$WORK/$2.out" >&2
      fail "job $1 ($2) still $state after ${JOB_LIMIT_S}s"
    fi
    sleep 1
  done
  [ "$state" = COMPLETED ] && [ "$(job_field "$1" ExitCode)" = 0:0 ] ||
    { cat "$WORK/$2.out" >&2; fail "job $1 ($2) ended $state, exit $(job_field "$1" ExitCode)"; }
}

wait_for_steps() {  # name count: until the run has logged `count` steps
  for _ in $(seq 1 600); do
    [ -f "$WORK/$1/metrics.jsonl" ] && [ "$(wc -l < "$WORK/$1/metrics.jsonl")" -ge "$2" ] && return
    sleep 0.2
  done
  cat "$WORK/$1.out" >&2; fail "$1: no $2 steps logged within 120 s"
}

# Interrupted by `scancel ARGS...` after 10 steps: the job must come back once and end like plain.
signalled_run() {  # name signal-name scancel-options...
  local name=$1 signal=$2; shift 2
  local job start took; job=$(submit "$name")
  wait_for_steps "$name" 10
  scancel "$@" "$job"
  start=$(date +%s)
  wait_for_job "$job" "$name"
  took=$(( $(date +%s) - start ))
  local out="$WORK/$name.out"
  grep -q "stop requested ($signal): checkpointing at step" "$out" || { cat "$out"; fail "$name: no stop message naming $signal"; }
  grep -q "stopped by $signal at step .* exit code 75 (preempted)" "$out" || { cat "$out"; fail "$name: kiln did not exit 75"; }
  if [ "$1" = --batch ]; then
    grep -q "kiln.sbatch: SIGUSR1 received; passing SIGUSR1 to the ranks" "$out" || { cat "$out"; fail "$name: the script did not pass the signal on"; }
  fi
  grep -q "requeueing job $job" "$out" || { cat "$out"; fail "$name: the script did not requeue the job"; }
  grep -q "kiln.sbatch: job $job (start 2)" "$out" || { cat "$out"; fail "$name: the job did not start again"; }
  grep -q "trained $STEPS steps" "$out" || { cat "$out"; fail "$name: the requeued job did not finish"; }
  [ "$(job_field "$job" Restarts)" = 1 ] || { scontrol show job "$job"; fail "$name: expected 1 restart"; }
  local stops; stops=$(ls -d "$WORK/$name/checkpoints"/step-* | grep -v "step-0*$STEPS\$" | wc -l)
  [ "$stops" = 1 ] || { ls "$WORK/$name/checkpoints"; fail "$name: expected one checkpoint before step $STEPS"; }
  same_run "$WORK/plain" "$WORK/$name" $STEPS
  local at; at=$(ls -d "$WORK/$name/checkpoints"/step-* | head -1 | sed 's/.*step-0*//')
  echo "$name: $signal at step $at, requeued, resumed and finished ${took}s after the signal"
}

start=$(date +%s)
job=$(submit plain)
wait_for_job "$job" plain
grep -q "trained $STEPS steps" "$WORK/plain.out" || { cat "$WORK/plain.out"; fail "plain: did not train $STEPS steps"; }
grep -q "kiln.sbatch: kiln exited with code 0" "$WORK/plain.out" || { cat "$WORK/plain.out"; fail "plain: kiln did not exit 0"; }
[ -f "$WORK/plain/checkpoints/$(printf 'step-%06d' $STEPS)/model.safetensors" ] || fail "plain: no final checkpoint"
[ "$(losses "$WORK/plain/metrics.jsonl" | wc -l)" = $STEPS ] || fail "plain: expected $STEPS loss records"
echo "plain: $STEPS steps on 2 ranks in $(( $(date +%s) - start ))s"

signalled_run usr1 SIGUSR1 --batch --signal=USR1
# Preemption's GraceTime starts with SIGTERM to the job's steps (job_signal without the batch
# flag, as this scancel sends it); the batch shell and srun are not signalled.
signalled_run term SIGTERM --signal=TERM
pass "kiln.sbatch on Slurm: trains and checkpoints; after SIGUSR1 and after SIGTERM it requeues itself and resumes to the same weights, bit for bit ($(( $(date +%s) - start ))s)"
