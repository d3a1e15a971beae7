#!/usr/bin/env bash
# chorusrun under a real Slurm on this machine (issue 25): munge, slurmctld and two
# slurmd (nodes n1 and n2, both on 127.0.0.1, each on its own port) with all their
# files in a temporary directory. The names n1 and n2 resolve nowhere, as on clusters
# whose node names are Slurm's own: chorusrun must take the master address from Slurm.
#
# Scenarios, each with the seed job (chorus-mnist, a few steps):
#   srun -N2            trains; both ranks end with the same parameter checksum
#   layouts             ... which one chorusrun of two workers gives too (same threads)
#   Slurm silent        no scontrol answer: SLURM_LAUNCH_NODE_IPADDR, with a warning
#   nothing resolves    every node fails at once, naming 'n1'
#   srun -N1 -n2        refused on both tasks: one chorusrun per node
#   two jobs, one node  run side by side (ports from the job ids)
#   sbatch -N2          trains, with CHORUS_JOB_TOKEN from the script (no warning)
#   kill -9 a launcher  the other node's launcher ends with an error, no hang
#   scancel             a running job ends on both nodes, each saying why
#
# Usage: tests/run/slurm_test.sh BIN_DIR (CHORUS_SLURM_SCENARIOS: a subset, by name)
# Exit status: 0 passed, 1 failed, 77 skipped (Slurm or munge missing, not root, or
# Slurm did not start; the reason is printed). Every wait has a deadline; the daemons,
# jobs and files are removed on every exit (trap).
set -uo pipefail

bin=$(cd "${1:?usage: slurm_test.sh BIN_DIR}" && pwd)
data=/usr/share/datasets/fashion-mnist
failures=0
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for tool in munged slurmctld slurmd srun sbatch scancel scontrol squeue sinfo timeout; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh slurm-wlm munge)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start jobs"
[ -d "$data" ] || skip "no Fashion-MNIST in $data (scripts/install-deps.sh)"
[ -x "$bin/chorusrun" ] && [ -x "$bin/chorus-mnist" ] || skip "build chorusrun and chorus-mnist first"

work=$(mktemp -d /tmp/chorus_slurm_test.XXXXXX)
chmod 700 "$work"
daemons=()
export SLURM_CONF=$work/slurm.conf

# Jobs first (their steps are slurmd's children's children), then the daemons, each by
# its pid, SIGKILL for any that outlives 10 s.
cleanup() {
  if [ -f "$SLURM_CONF" ] && [ ${#daemons[@]} -gt 0 ]; then
    timeout 10 scancel --full --signal=KILL --partition=test >/dev/null 2>&1
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for pid in "${daemons[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Three ports free on loopback now: slurmctld's and one per slurmd.
read -r ctld_port n1_port n2_port < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))') || skip "cannot pick ports on 127.0.0.1"

mkdir -m 700 "$work/munge"
head -c 128 /dev/urandom >"$work/munge/munge.key"
chmod 400 "$work/munge/munge.key"
munged --force --foreground --socket="$work/munge/sock" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/pid" --log-file="$work/munge/log" --seed-file="$work/munge/seed" \
  >/dev/null 2>&1 &
daemons+=($!)

cat >"$SLURM_CONF" <<EOF
ClusterName=chorustest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
KillWait=5
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n1_port CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n2_port CPUs=2 State=UNKNOWN
PartitionName=test Nodes=n[1-2] Default=YES MaxTime=30 State=UP OverSubscribe=FORCE:4
EOF
mkdir "$work/state"
for _ in $(seq 50); do [ -S "$work/munge/sock" ] && break; sleep 0.1; done
slurmctld -D -c -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
daemons+=($!)
for node in n1 n2; do
  slurmd -D -N "$node" -f "$SLURM_CONF" >"$work/slurmd-$node.out" 2>&1 &
  daemons+=($!)
done
idle_nodes() { timeout 5 sinfo -h -N -t idle -o %N 2>/dev/null | wc -l; }
for _ in $(seq 150); do
  [ "$(idle_nodes)" -eq 2 ] && break
  sleep 0.2
done
if [ "$(idle_nodes)" -ne 2 ]; then
  tail -n 5 "$work"/*.log "$work"/*.out "$work/munge/log" 2>/dev/null
  skip "Slurm did not bring up n1 and n2 within 30 s (logs above)"
fi
echo "slurm: controller on 127.0.0.1:$ctld_port, slurmd n1:$n1_port n2:$n2_port"

export OMP_NUM_THREADS=1 CHORUS_CONNECT_TIMEOUT=60
unset CHORUS_JOB_TOKEN MASTER_ADDR MASTER_PORT
run=("$bin/chorusrun" --nproc-per-node 1)
mnist=("$bin/chorus-mnist" --epochs 1 --max-steps 20)
short=("$bin/chorus-mnist" --epochs 1 --max-steps 5)

# show FILE: chorusrun's own lines of FILE, so that the log shows what each case printed.
show() { grep -v 'loss:\|curr epoch\|^[0-9]*: *$' "$1" | grep 'chorusrun\|srun:\|error' | sed 's/^/    | /'; }

# expect_text FILE TEXT WHAT: FILE contains TEXT (fixed string).
expect_text() { grep -qF -- "$2" "$1" || fail "$3: no '$2' in: $(cat "$1")"; }

# same_params FILE WHAT: ranks 0 and 1 printed one and the same parameter checksum.
same_params() {
  local p0 p1
  p0=$(grep -o 'rank 0 params [0-9a-f]*' "$1" | awk '{print $4}')
  p1=$(grep -o 'rank 1 params [0-9a-f]*' "$1" | awk '{print $4}')
  [ -n "$p0" ] && [ "$p0" = "$p1" ] || fail "$2: checksums '$p0' and '$p1': $(cat "$1")"
}

# A directory whose scontrol answers nothing, as when the controller does not.
mkdir "$work/silent"
printf '#!/bin/sh\nexit 1\n' >"$work/silent/scontrol"
chmod +x "$work/silent/scontrol"

scenario_srun() {
  local out=$work/srun.out
  timeout 180 srun -N2 -n2 "${run[@]}" "${mnist[@]}" >"$out" 2>&1 || fail "srun -N2 exited $?: $(cat "$out")"
  same_params "$out" "srun -N2"
  expect_text "$out" "job token is the Slurm job id" "srun -N2 without CHORUS_JOB_TOKEN"
}

# Two launchers of one worker give the bits of one launcher of two workers when
# OMP_NUM_THREADS is the same (exported here; by default it is CPUs / local workers).
scenario_layouts() {
  local out=$work/standalone.out p_srun p_alone
  timeout 180 "${run[@]}" --standalone --nproc-per-node 2 "${mnist[@]}" >"$out" 2>&1 ||
    fail "standalone 1 x 2 exited $?: $(cat "$out")"
  same_params "$out" "standalone 1 x 2"
  p_srun=$(grep -o 'rank 0 params [0-9a-f]*' "$work/srun.out")
  p_alone=$(grep -o 'rank 0 params [0-9a-f]*' "$out")
  [ -n "$p_srun" ] && [ "$p_srun" = "$p_alone" ] ||
    fail "OMP_NUM_THREADS=1: srun -N2 x 1 gave '$p_srun', one launcher x 2 '$p_alone'"
}

scenario_launch_node_address() {
  local out=$work/launch.out
  timeout 180 srun -N2 -n2 env PATH="$work/silent:$PATH" "${run[@]}" "${short[@]}" \
    >"$out" 2>&1 || fail "srun -N2 without scontrol exited $?: $(cat "$out")"
  same_params "$out" "srun -N2 without scontrol"
  expect_text "$out" "using SLURM_LAUNCH_NODE_IPADDR=127.0.0.1" "srun -N2 without scontrol"
}

scenario_unresolvable() {
  local out=$work/unresolvable.out rc=0
  timeout 120 srun -N2 -n2 -l env -u SLURM_LAUNCH_NODE_IPADDR PATH="$work/silent:$PATH" \
    "${run[@]}" "${mnist[@]}" >"$out" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "nothing resolves: srun exited $rc: $(cat "$out")"
  for task in 0 1; do
    grep -q "^$task: chorusrun: cannot resolve the master address 'n1'" "$out" ||
      fail "nothing resolves: task $task did not name 'n1': $(cat "$out")"
  done
  show "$out"
}

scenario_two_tasks_per_node() {
  local out=$work/two_tasks.out rc=0
  timeout 120 srun -N1 -n2 -l "${run[@]}" "${mnist[@]}" >"$out" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "srun -N1 -n2: exited $rc: $(cat "$out")"
  for task in 0 1; do
    grep -q "^$task: chorusrun: srun started more than one task on a node.*--ntasks-per-node=1" \
      "$out" || fail "srun -N1 -n2: task $task was not refused: $(cat "$out")"
  done
  grep -q "params" "$out" && fail "srun -N1 -n2 trained: $(cat "$out")"
  show "$out"
}

# The master address is given, so that only the ports can collide.
scenario_two_jobs_one_node() {
  local a=$work/job_a.out b=$work/job_b.out pa pb
  timeout 180 srun -N1 -w n1 "${run[@]}" --master-addr 127.0.0.1 "${mnist[@]}" >"$a" 2>&1 &
  pa=$!
  timeout 180 srun -N1 -w n1 "${run[@]}" --master-addr 127.0.0.1 "${mnist[@]}" >"$b" 2>&1 &
  pb=$!
  wait "$pa" || fail "first of two jobs on n1 exited $?: $(cat "$a")"
  wait "$pb" || fail "second of two jobs on n1 exited $?: $(cat "$b")"
  expect_text "$a" "rank 0 params" "first of two jobs on n1"
  expect_text "$b" "rank 0 params" "second of two jobs on n1"
}

scenario_sbatch() {
  local out=$work/sbatch.out
  cat >"$work/job.sh" <<EOF
#!/bin/bash
export CHORUS_JOB_TOKEN=\$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')
srun --ntasks-per-node=1 ${run[*]} ${mnist[*]}
EOF
  timeout 240 sbatch --wait -N2 --ntasks-per-node=1 -o "$out" "$work/job.sh" >/dev/null 2>&1 ||
    fail "sbatch -N2 exited $?: $(cat "$out" 2>/dev/null)"
  same_params "$out" "sbatch -N2"
  grep -q "job token is the Slurm job id" "$out" && fail "sbatch: token warning with CHORUS_JOB_TOKEN set"
}

# A batch job training for long (until stopped), its launchers' pids in $work/pids.
start_long_job() {
  local name=$1
  rm -f "$work/pid".*
  cat >"$work/$name.sh" <<EOF
#!/bin/bash
export CHORUS_JOB_TOKEN=secret-$name
srun --ntasks-per-node=1 -l bash -c 'echo \$\$ >$work/pid.\$SLURM_NODEID; exec ${run[*]} $bin/chorus-mnist --epochs 100'
EOF
  job=$(timeout 10 sbatch --parsable -N2 --ntasks-per-node=1 -o "$work/$name.out" "$work/$name.sh") ||
    { fail "$name: sbatch refused the job"; return 1; }
  # Training has begun when both ranks have printed a loss.
  for _ in $(seq 300); do
    [ "$(cat "$work/$name.out" 2>/dev/null | grep -c 'loss:')" -ge 2 ] && [ -s "$work/pid.1" ] &&
      return 0
    sleep 0.2
  done
  fail "$name: job $job did not start training within 60 s: $(cat "$work/$name.out")"
  return 1
}

# Waits up to 60 s for job $job to leave the queue.
wait_job_gone() {
  for _ in $(seq 300); do
    [ -z "$(timeout 5 squeue -h -j "$job" -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "$1: job $job still in the queue 60 s later: $(cat "$work/$1.out")"
  timeout 10 scancel --signal=KILL "$job"
  return 1
}

scenario_kill_launcher() {
  start_long_job killed || return
  kill -KILL "$(cat "$work/pid.1")"
  wait_job_gone killed
  # Node 0 (task 0) ends on its own with an error line, not at the job's time limit.
  grep -q "^0: chorusrun.*\(job failed\|node 1\)" "$work/killed.out" ||
    fail "kill -9 of node 1's launcher: node 0 said nothing: $(cat "$work/killed.out")"
  show "$work/killed.out"
}

scenario_scancel() {
  start_long_job cancelled || return
  timeout 10 scancel "$job" || fail "scancel $job exited $?"
  wait_job_gone cancelled
  for task in 0 1; do
    grep -q "^$task: chorusrun: job stopped: the launcher of node [01] (host [^)]*) received SIGTERM" \
      "$work/cancelled.out" || fail "scancel: task $task did not say why: $(cat "$work/cancelled.out")"
  done
  show "$work/cancelled.out"
}

# CHORUS_SLURM_SCENARIOS="srun sbatch" runs only those (layouts needs srun).
for scenario in ${CHORUS_SLURM_SCENARIOS:-srun layouts launch_node_address unresolvable \
                two_tasks_per_node two_jobs_one_node sbatch kill_launcher scancel}; do
  before=$failures
  "scenario_$scenario"
  [ "$failures" -eq "$before" ] && echo "ok: $scenario" || echo "FAILED: $scenario"
done
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all Slurm scenarios passed"
