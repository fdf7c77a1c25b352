#!/usr/bin/env bash
# Stops the localhost Slurm cluster started by start.sh, by the PIDs it recorded (never by name).
set -uo pipefail

STATE_DIR=${SFTREE_SLURM_DIR:-/tmp/sftree-slurm}
PIDS="$STATE_DIR/pids"

log() { echo "slurm-stop: $*" >&2; }

if [ ! -f "$PIDS" ]; then
  log "nothing to stop ($PIDS not found)"
  exit 0
fi
# shellcheck disable=SC1090
. "$PIDS"

# Alive and not a zombie (an exited daemon whose parent has not reaped it yet counts as stopped).
running() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# Stop in reverse start order; check the process name first so a recycled PID is never signalled.
stop_one() { # name pid
  local name=$1 pid=${2:-}
  if [ -z "$pid" ] || ! running "$pid"; then
    log "$name: not running"
    return 0
  fi
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
    log "$name: pid $pid is now '$(cat "/proc/$pid/comm" 2>/dev/null)', left alone"
    return 0
  fi
  kill -TERM "$pid"
  for _ in $(seq 100); do
    running "$pid" || { log "$name: stopped (pid $pid)"; return 0; }
    sleep 0.1
  done
  log "$name: still running after 10 s, sending KILL (pid $pid)"
  kill -KILL "$pid" 2>/dev/null || true
}

stop_one slurmd "${slurmd:-}"
stop_one slurmctld "${slurmctld:-}"
stop_one munged "${munged:-}"
rm -f "$PIDS"
