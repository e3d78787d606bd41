#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine (munged, slurmctld, slurmd; Debian's slurm-wlm),
# so that tests/launch/test_slurm.sh can submit launch/slurm/kiln.sbatch for real. CI (.ci/run)
# calls it before scripts/test.sh. Needs root (daemons and /etc); works without systemd.
# Idempotent: packages already present are not reinstalled, daemons already running are kept.
#
#   scripts/start-slurm.sh          install if missing, configure, start, wait for the node
#   scripts/start-slurm.sh --stop   stop slurmd, slurmctld and munged (those this script started)
#
# The node offers `nproc` CPUs (KILN_SLURM_CPUS overrides) and no GPUs, in one partition `debug`.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
RUN_DIR=/run/kiln-slurm  # the pid files of slurmctld and slurmd
pid_file() {                # name: where the daemon writes its pid (munged as user munge)
  if [ "$1" = munged ]; then echo /run/munge/munged.pid; else echo "$RUN_DIR/$1.pid"; fi
}

stop_daemon() {  # name
  local pid_file; pid_file=$(pid_file "$1")
  if [ -f "$pid_file" ]; then
    local pid; pid=$(cat "$pid_file")
    if $SUDO kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do $SUDO kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      echo "start-slurm: stopped $1 ($pid)"
    fi
    $SUDO rm -f "$pid_file"
  fi
}

if [ "${1:-}" = "--stop" ]; then
  stop_daemon slurmd
  stop_daemon slurmctld
  stop_daemon munged
  exit 0
fi

packages=(slurm-wlm munge)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "start-slurm: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

host=$(hostname)
cpus=${KILN_SLURM_CPUS:-$(nproc)}
# Memory Slurm may hand out, in MiB: what the machine has, less 1 GiB for everything else.
memory=$(awk '/MemTotal/ { m = int($2 / 1024) - 1024; print (m > 1024 ? m : 1024) }' /proc/meminfo)

$SUDO mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge /etc/slurm \
  /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$RUN_DIR"
if [ ! -f /etc/munge/munge.key ]; then
  $SUDO dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
$SUDO chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
$SUDO chmod 400 /etc/munge/munge.key

# SlurmUser=root: no slurm account is needed and the daemons run as whoever starts them (root).
# proctrack/linuxproc and task/none: no cgroup hierarchy to manage (containers, no systemd).
# OverSubscribe=FORCE lets a test's jobs share the node's few CPUs with each other.
# AuthInfo cred_expire: a requeued job waits this long before it may start again (120 s by
# default); 10 s keeps the requeue test short.
conf=$(cat <<EOF
# Written by scripts/start-slurm.sh: a one-node cluster for Kiln's tests.
ClusterName=kiln
SlurmctldHost=$host
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
AuthInfo=cred_expire=10
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
# cgroup.conf must exist and load even with proctrack/linuxproc, or slurmd stops with "Unable to
# initialize cgroup plugin"; this version refuses CgroupAutomount=disabled.
cgroup_conf=$'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\nCgroupAutomount=no'
changed=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" | $SUDO tee /etc/slurm/slurm.conf > /dev/null
  changed=1
fi
if [ "$(cat /etc/slurm/cgroup.conf 2>/dev/null)" != "$cgroup_conf" ]; then
  printf '%s\n' "$cgroup_conf" | $SUDO tee /etc/slurm/cgroup.conf > /dev/null
  changed=1
fi

running() {  # name: whether the daemon this script started is alive
  local pid_file; pid_file=$(pid_file "$1")
  [ -f "$pid_file" ] && $SUDO kill -0 "$(cat "$pid_file")" 2>/dev/null
}
if [ "$changed" = 1 ]; then
  # A new configuration: restart what runs on the old one.
  stop_daemon slurmd
  stop_daemon slurmctld
fi

if ! munge -n 2>/dev/null | unmunge > /dev/null 2>&1; then
  $SUDO su -s /bin/sh munge -c /usr/sbin/munged
  munge -n | unmunge > /dev/null || { echo "start-slurm: munged does not answer" >&2; exit 1; }
fi
if ! running slurmctld; then $SUDO slurmctld; fi
if ! running slurmd; then $SUDO slurmd; fi

# The node is usable once sinfo calls it idle (or already busy with a job).
for _ in $(seq 1 60); do
  state=$(sinfo --noheader --nodes="$host" --format=%T 2>/dev/null || true)
  case "$state" in
    idle* | mixed* | allocated*)
      echo "start-slurm: node $host $state ($cpus CPUs, ${memory} MiB) in partition debug"
      exit 0
      ;;
  esac
  sleep 1
done
echo "start-slurm: node $host is not idle after 60 s (state: ${state:-none}); see" \
  "/var/log/slurm/slurmctld.log and /var/log/slurm/slurmd.log" >&2
exit 1
