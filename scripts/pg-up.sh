#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster on 127.0.0.1 for the store tests and print its URL.
#
# Idempotent and fast: a running cluster is reused, a stopped one started again. Uses Debian's
# postgresql binaries (newest /usr/lib/postgresql/*/bin), runs the server as the `postgres` user
# (PostgreSQL refuses root), with fsync off (the data is thrown away). A role and database
# `spotwise` with a random password; the URL is printed on stdout and kept in $PG_UP_DIR/url
# (0600). `scripts/pg-up.sh stop` stops the cluster.
set -euo pipefail

log() { echo "[pg-up] $*" >&2; }

DIR=${PG_UP_DIR:-/var/tmp/spotwise-pg}
PORT=${PG_UP_PORT:-55432}
DATA="$DIR/data"
URL_FILE="$DIR/url"

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it runs the server as the postgres user)"
  exit 1
fi
BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
if [ -z "$BIN" ] || [ ! -x "$BIN/postgres" ]; then
  log "installing postgresql with apt-get (one time)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
as_pg() { runuser -u postgres -- "$@"; }

if [ "${1:-}" = stop ]; then
  [ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
  exit 0
fi

mkdir -p "$DIR"
chown postgres: "$DIR"
chmod 0700 "$DIR"
if [ ! -s "$DATA/PG_VERSION" ]; then
  log "initdb $DATA"
  as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
    --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$URL_FILE"
fi
if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  log "starting on 127.0.0.1:$PORT"
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start -o \
    "-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$DIR -c fsync=off \
     -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >/dev/null
fi
if [ ! -s "$URL_FILE" ]; then
  password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  as_pg "$BIN/psql" -h "$DIR" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q <<SQL
SET client_min_messages = warning;
DROP DATABASE IF EXISTS spotwise;
DROP ROLE IF EXISTS spotwise;
CREATE ROLE spotwise LOGIN PASSWORD '$password';
CREATE DATABASE spotwise OWNER spotwise;
SQL
  (umask 077 && echo "postgresql://spotwise:$password@127.0.0.1:$PORT/spotwise" >"$URL_FILE")
fi
log "ready: $(sed 's/:[^:@]*@/:***@/' "$URL_FILE")"
cat "$URL_FILE"
