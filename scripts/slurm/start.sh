#!/usr/bin/env bash
# Starts a single-node Slurm cluster on localhost for tests and CI (idempotent).
#
#   bash scripts/slurm/start.sh        # install (Debian, as root) + configure + start; waits for an idle node
#   bash scripts/slurm/stop.sh         # stops the daemons by the PIDs this script recorded
#
# No systemd: munged, slurmctld and slurmd are started directly, as root, in daemon mode with pid files.
# No accounting database (AccountingStorageType=none), so `sacct` has nothing: Slurm's own record of every job
# is the job completion log (JobCompType=jobcomp/filetxt, JobCompLoc=$SFTREE_SLURM_DIR/jobcomp.txt) and squeue
# (finished jobs stay visible for MinJobAge seconds).
#
# Environment:
#   SFTREE_SLURM_DIR    state, spool, logs, pids and the job completion log   [/tmp/sftree-slurm]
#   SFTREE_SLURM_CPUS   CPUs of the node                                       [2]
#   SFTREE_SLURM_FORCE  1: overwrite an /etc/slurm/slurm.conf this script did not write
set -euo pipefail

STATE_DIR=${SFTREE_SLURM_DIR:-/tmp/sftree-slurm}
CPUS=${SFTREE_SLURM_CPUS:-2}
CONF=/etc/slurm/slurm.conf
MARKER="# written by sftree scripts/slurm/start.sh"
PIDS="$STATE_DIR/pids"
NODE=localhost

log() { echo "slurm-start: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Alive and not a zombie (a daemon that exited but was not reaped, e.g. in a container without an init).
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

node_state() { timeout 10 sinfo -h -n "$NODE" -o %t 2>/dev/null | head -n1 || true; }

# --- already up? ------------------------------------------------------------------------------------------
if [ -f "$PIDS" ]; then
  # shellcheck disable=SC1090
  . "$PIDS"
  if { [ -z "${munged:-}" ] || alive "$munged"; } && alive "${slurmctld:-}" && alive "${slurmd:-}" \
    && [[ "$(node_state)" =~ ^(idle|mix|alloc) ]]; then
    log "already running (munged=${munged:-not ours} slurmctld=$slurmctld slurmd=$slurmd), state in $STATE_DIR"
    cat "$PIDS"
    exit 0
  fi
  log "stale state in $PIDS: stopping what is left and starting afresh"
  bash "$(dirname "$0")/stop.sh" || true
fi

# --- install ----------------------------------------------------------------------------------------------
missing=()
for pair in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "needs root to install ${missing[*]} (Debian packages)"
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$(id -u)" = 0 ] || die "the daemons run as root: run this script as root"

# --- configure --------------------------------------------------------------------------------------------
mkdir -p "$STATE_DIR"/{ctld,spool,logs} /run/munge /var/log/munge /var/lib/munge /etc/slurm
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force; else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
fi
chmod 0700 /etc/munge && chmod 0600 /etc/munge/munge.key

if [ -f "$CONF" ] && ! grep -qF "$MARKER" "$CONF" && [ "${SFTREE_SLURM_FORCE:-0}" != 1 ]; then
  die "$CONF exists and was not written by this script (set SFTREE_SLURM_FORCE=1 to replace it)"
fi
# The node's real memory as slurmd measures it, so the node is not drained for "Low RealMemory".
MEM=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
[ -n "$MEM" ] || MEM=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)

cat >"$CONF.tmp" <<EOF
$MARKER; state in $STATE_DIR
ClusterName=sftree-local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/logs/slurmctld.log
SlurmdLogFile=$STATE_DIR/logs/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Containers: no cgroups, no systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
# No accounting database; every finished job is written to the job completion log instead.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE_DIR/jobcomp.txt
# Finished jobs stay in squeue this long, so \`slurm-status-command: squeue\` sees their final state.
MinJobAge=600
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
mv "$CONF.tmp" "$CONF"

# --- start ------------------------------------------------------------------------------------------------
pid_of() { [ -s "$1" ] && cat "$1" || true; }
wait_pidfile() { # file seconds
  for _ in $(seq "$(($2 * 10))"); do alive "$(pid_of "$1")" && return 0; sleep 0.1; done
  return 1
}

if [ -S /run/munge/munge.socket.2 ] && alive "$(pid_of /run/munge/munged.pid)"; then
  log "munged already running (pid $(pid_of /run/munge/munged.pid)), using it; stop.sh will leave it alone"
  MUNGED=""
else
  rm -f /run/munge/munged.pid
  munged --force --pid-file=/run/munge/munged.pid --log-file="$STATE_DIR/logs/munged.log"
  wait_pidfile /run/munge/munged.pid 10 || die "munged did not start, see $STATE_DIR/logs/munged.log"
  MUNGED=$(pid_of /run/munge/munged.pid)
fi

rm -f "$STATE_DIR/slurmctld.pid" "$STATE_DIR/slurmd.pid"
# -c: a fresh job table each start (this is a throwaway test cluster).
slurmctld -c
wait_pidfile "$STATE_DIR/slurmctld.pid" 20 || die "slurmctld did not start, see $STATE_DIR/logs/slurmctld.log"
slurmd -N "$NODE"
wait_pidfile "$STATE_DIR/slurmd.pid" 20 || die "slurmd did not start, see $STATE_DIR/logs/slurmd.log"

cat >"$PIDS.tmp" <<EOF
munged=$MUNGED
slurmctld=$(pid_of "$STATE_DIR/slurmctld.pid")
slurmd=$(pid_of "$STATE_DIR/slurmd.pid")
EOF
mv "$PIDS.tmp" "$PIDS"

# --- wait for an idle node --------------------------------------------------------------------------------
state=""
for i in $(seq 120); do
  state=$(node_state)
  case "$state" in
    idle*) break ;;
    down* | drain* | drng*) [ $((i % 5)) = 1 ] && scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.5
done
[[ "$state" == idle* ]] || die "node $NODE is '${state:-unknown}' after 60 s, see $STATE_DIR/logs/"
log "cluster up: node $NODE idle, CPUs=$CPUS RealMemory=${MEM}M, job completion log $STATE_DIR/jobcomp.txt"
cat "$PIDS"
