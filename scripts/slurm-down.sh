#!/usr/bin/env bash
# Stop the localhost SLURM cluster started by scripts/slurm-up.sh (slurmd, slurmctld, munged).
set -uo pipefail
log() { echo "[slurm-down] $*" >&2; }
STATE_DIR=${SLURM_UP_STATE:-/var/spool/spotwise-slurm}

stop() {  # stop one daemon by its pid file, else by exact process name
  local name=$1 pidfile=$2 pid=""
  [ -f "$pidfile" ] && pid=$(cat "$pidfile" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill "$pid"
  elif pgrep -x "$name" >/dev/null; then
    log "stopping $name"
    pkill -x "$name"
  else
    log "$name not running"
    return 0
  fi
  for _ in $(seq 50); do pgrep -x "$name" >/dev/null || return 0; sleep 0.1; done
  log "$name did not stop in 5 s; killing"
  pkill -9 -x "$name" || true
}

stop slurmd "$STATE_DIR/slurmd.pid"
stop slurmctld "$STATE_DIR/slurmctld.pid"
[ -n "${SLURM_UP_KEEP_MUNGE:-}" ] || stop munged /run/munge/munged.pid
