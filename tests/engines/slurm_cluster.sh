# Sourced by tests that need Slurm: start_slurm_cluster starts a one-node cluster of its own
# (munged, slurmctld, slurmd with a slurm.conf in a scratch directory, every port picked
# free) and registers its teardown in the caller's `cleanups`, so it goes on any exit.
# Needs root (slurmd runs jobs as their user) and Debian's slurmctld, slurmd, slurm-client
# and munge. Exports SLURM_CONF for srun, sbatch and sinfo.
# shellcheck shell=bash

# stop_pidfile FILE: TERM to the daemon named there, then KILL after 5 s.
stop_pidfile() {
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  kill "$pid" 2> /dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2> /dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2> /dev/null || true
}

# first_job_id_with_free_port: a job id whose port as partrain derives it from the id (10000 +
# id % 20000) was free a moment ago, with the port above it; jobs numbered from there find it.
first_job_id_with_free_port() {
  "${python:-python3}" - <<'PY'
import random, socket
for _ in range(100):
    port = random.randrange(10000, 30000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port)); s.close()
        t = socket.socket(); t.bind(("127.0.0.1", port + 1)); t.close()
    except OSError:
        continue
    print(port - 10000 + 20000)
    break
PY
}

# start_slurm_cluster DIR FIRST_JOB_ID [CRED_EXPIRE]
# CRED_EXPIRE: AuthInfo's cred_expire in seconds (Slurm's default 120), which is also how long
# a requeued job waits before it may start again.
start_slurm_cluster() {
  local dir=$1 first_job=$2 cred_expire=${3:-120} node ports
  for tool in munged mungekey slurmctld slurmd srun sbatch sinfo; do
    command -v "$tool" > /dev/null || skip "no $tool (Debian: munge, slurmctld, slurmd, slurm-client)"
  done
  [ "$(id -u)" -eq 0 ] || skip "a Slurm cluster of the test's own needs root (slurmd, munged)"
  node=$(hostname -s)
  getent hosts "$node" > /dev/null ||
    skip "this host's name '$node' does not resolve; Slurm's node list would name it"
  # A job inside a job would read the outer job's variables.
  while read -r name; do unset "$name"; done < <(compgen -v SLURM_)
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  chmod 700 "$dir/munge"

  cleanups+=("stop_pidfile '$dir/munge/pid'")
  mungekey -c -k "$dir/munge/munge.key" > /dev/null
  munged -f -S "$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munge/log" --pid-file="$dir/munge/pid" --seed-file="$dir/munge/seed"

  ports=$(free_port_pair)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=partraintest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ports
SlurmdPort=$((ports + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=$cred_expire
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
FirstJobId=$first_job
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF=$dir/slurm.conf
  cleanups+=("stop_pidfile '$dir/slurmctld.pid'" "stop_pidfile '$dir/slurmd.pid'")
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF" -N "$node"
  for _ in $(seq 1 150); do
    [ "$(sinfo -h -o %T 2> /dev/null)" = idle ] && return 0
    sleep 0.2
  done
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" 2> /dev/null || true
  echo "FAIL: the test's Slurm node did not become idle within 30 s"
  exit 1
}
