# A "machine" of the local and sim providers (see process.py): the attempt's supervisor, as a
# POSIX shell script, so that an attempt costs no Python interpreter (about 1 MiB and a few
# milliseconds of CPU instead of 16 MiB and 150 ms: one server drives a thousand of these).
#
# sh machine.sh DIR LOG GRACE_S BOOT_S NOTICE_AT LOST_AT BANNER CODE PYTHON NOTICE_VIA CWD -- COMMAND...
# NOTICE_AT, LOST_AT: wall times, '-' for none; CODE: a packed workdir <store>/<sha256>.tar.gz
# or '-', which PYTHON unpacks into DIR/workdir before the command runs; NOTICE_VIA: sigterm,
# or parent (the notice is SIGUSR1 to the parent, machine.py, which posts it on its IMDS); CWD:
# where the command runs (the launcher starts this shell with posix_spawn, which cannot set it).
#
# Standard input is the attempt's lock file, flocked by the launcher: it stays locked exactly as
# long as this shell runs (an asynchronous command's input is /dev/null, and every other command
# ends before the shell does). The shell writes machine.json (its pid and start time, the
# command's) and, at the end, exit.json (the outcome, the exit code, when). At NOTICE_AT the
# command gets the platform's notice (SIGTERM); at LOST_AT the machine is taken away (SIGKILL to
# everything the command started). A SIGTERM to this shell (terminate, cancel) does the same with
# the grace period starting now. An exit code above 128 reads as the shell reports it: killed by
# signal N, written as -N.
trap 'woke=1 stop_requested=1; on_stop' TERM
trap '' INT

dir=$1 log=$2 grace_s=$3 boot_s=$4 notice_at=$5 lost_at=$6 banner=$7 code=$8 python=$9
notice_via=${10} cwd=${11}
shift 11
[ "$1" = "--" ] && shift

machine=$$ stop_requested='' stopping='' noticed='' lost='' outcome=exited child=''
waiter=''

now() { now=$(date +%s.%N); }

ticks() { # REPLY: when process $1 started, in clock ticks since boot ('' once it is gone)
	REPLY=''
	{ read -r stat < "/proc/$1/stat"; } 2> /dev/null || return 0
	set -- ${stat##*) }
	shift 19
	REPLY=$1
}

write_json() { # FILE DOC: replaced at once, never seen half-written
	printf '%s\n' "$2" > "$1.part" && mv -f "$1.part" "$1"
}

say() { printf '[spotwise] %s\n' "$1" >> "$log"; }

finish() { # OUTCOME EXIT_CODE ('null': none)
	end_timers
	now
	write_json "$dir/exit.json" "{\"outcome\": \"$1\", \"exit_code\": $2, \"ended_at\": $now}"
	exit 0
}

seconds_to() { # REPLY: wall seconds from now to each wall time given ('-' stays '-')
	now
	REPLY=$(awk -v now="$now" -v at="$*" 'BEGIN {
		n = split(at, t, " ")
		for (i = 1; i <= n; i++) printf "%s ", (t[i] == "-" ? "-" : t[i] - now)
	}')
}

start_timer() { # NOTICE_IN LOST_IN: USR1 to this shell at the notice, USR2 at the loss
	# (seconds from now, '-': never). Timers are never replaced, only ended with the machine: a
	# stop that comes while the machine starts its schedule's timer adds its own beside it, and
	# neither can cancel the other (replacing one raced with the trap, and a stop could lose its
	# grace). The timer checks that its parent is still this shell before it signals: a machine
	# killed outright must not leave a timer that signals whatever process gets its pid later.
	(
		waited=0
		for event in "$1:USR1" "$2:USR2"; do
			in=${event%:*}
			[ "$in" = "-" ] && continue
			sleep "$(awk -v a="$in" -v w="$waited" 'BEGIN { d = a - w; print (d > 0 ? d : 0) }')"
			waited=$in
			read -r me < /proc/self/stat
			set -- ${me##*) }
			[ "$2" = "$machine" ] || exit 0
			kill -s "${event#*:}" "$machine"
		done
	) &
}

end_timers() { # every process still below this shell (SIGKILL: a signal that comes as a
	# subshell starts may find no trap yet); at the end only timers and their sleeps are left
	below=''
	descendants "$machine"
	[ -z "$below" ] || kill -KILL $below 2> /dev/null
}

on_notice() {
	[ -n "$noticed" ] || [ -z "$child" ] && return
	noticed=1
	if [ -n "$stop_requested" ]; then
		say "stop requested: SIGTERM"
	elif [ "$notice_via" = parent ]; then
		read -r me < "/proc/$machine/stat"
		set -- ${me##*) }
		[ "$2" = "$PPID" ] && kill -USR1 "$PPID" # (only while that parent lives)
		return
	else
		say "interruption notice: SIGTERM"
	fi
	kill -TERM "$child" 2> /dev/null
}

on_lost() {
	[ -n "$lost" ] || [ -z "$child" ] && return
	lost=1
	say "machine taken away: SIGKILL"
	kill_tree
}

on_stop() { # a terminate request: the notice now, the machine taken away after the grace
	# (or at its loss, if that is sooner). As a trap it may run between any two commands of the
	# main flow, so it sets none of the variables that flow uses (REPLY, now).
	[ -n "$waiter" ] && kill "$waiter" 2> /dev/null # (a stop ends the boot at once)
	[ -z "$child" ] || [ -n "$stopping" ] || [ -n "$noticed" ] && return
	stopping=1 outcome=terminated
	on_notice
	start_timer - "$(awk -v now="$(date +%s.%N)" -v l="$lost_at" -v g="$grace_s" 'BEGIN {
		d = l - now
		print (l != "-" && d < g ? (d > 0 ? d : 0) : g)
	}')"
}

descendants() { # every process below $1 (/proc/PID/task/*/children), added to $below
	for kids_of in /proc/"$1"/task/*/children; do
		kids=''
		{ read -r kids < "$kids_of"; } 2> /dev/null
		for k in $kids; do
			below="$below $k"
			descendants "$k"
		done
	done
}

kill_tree() { # take the machine away: SIGKILL the command's group and everything it started
	below=''
	descendants "$child" # (before the kill: orphans would leave the tree)
	kill -KILL "-$child" 2> /dev/null
	for p in $below; do
		kill -KILL "-$p" 2> /dev/null
		kill -KILL "$p" 2> /dev/null
	done
}

ticks "$machine"
machine_ticks=$REPLY
write_json "$dir/machine.json" "{\"pid\": $machine, \"start_ticks\": $machine_ticks}"
trap 'woke=1; on_notice' USR1
trap 'woke=1; on_lost' USR2
if ! cd "$cwd" 2> /dev/null; then
	say "cannot enter the working directory $cwd"
	finish exited 1
fi

# provisioning: the machine is billed but not yet running (a stop or the loss ends it)
if awk -v b="$boot_s" 'BEGIN { exit !(b > 0) }'; then
	seconds_to "$lost_at"
	set -- $(awk -v b="$boot_s" -v l="${REPLY% }" 'BEGIN {
		if (l != "-" && l < b) print (l > 0 ? l : 0), "lost"; else print b, "up"
	}') "$@"
	sleep "$1" &
	waiter=$!
	wait "$waiter"
	waiter=''
	[ -n "$stop_requested" ] && finish terminated null
	[ "$2" = lost ] && finish lost null
	shift 2
fi

[ -n "$banner" ] && say "$banner"
if [ "$code" != "-" ]; then # the job's code, unpacked on this machine before it runs
	name=${code##*/}
	"$python" -m spotwise.control.workdir unpack "${code%/*}" "${name%.tar.gz}" "$dir/workdir" \
		< /dev/null >> "$log" 2>&1 || finish exited 1
	cd "$dir/workdir" || finish exited 1
fi

if ! command -v "$1" > /dev/null 2>&1; then
	say "cannot start $1: no such command (not found on PATH, or not executable)"
	finish exited 127
fi
# The command, in a session of its own. (An asynchronous command of this shell is no group
# leader, so setsid calls setsid() itself, starts no process, and $! is the command.)
setsid "$@" < /dev/null >> "$log" 2>&1 &
child=$!
ticks "$child"
now
write_json "$dir/machine.json" "{\"pid\": $machine, \"start_ticks\": $machine_ticks, \
\"child_pid\": $child, \"child_start_ticks\": ${REPLY:-null}, \"running_at\": $now}"

seconds_to "$notice_at" "$lost_at"
start_timer $REPLY
[ -n "$stop_requested" ] && on_stop

# A trap's signal ends `wait` with 128+N, the trap's commands may reap the command meanwhile:
# waiting again then gives the command's own status (kept until `wait` reports it).
while :; do
	woke=''
	wait "$child"
	status=$?
	[ -n "$woke" ] && [ "$status" -gt 128 ] || break
done

if [ -n "$lost" ]; then
	[ "$outcome" = exited ] && finish lost null
	finish "$outcome" null
fi
kill -KILL "-$child" 2> /dev/null # leave nothing behind on the "machine"
[ "$status" -gt 128 ] && status=$((128 - status))
case $status in 0 | 75) finish exited "$status" ;; esac
# Died of the notice itself (e.g. before its handler was installed): the platform's doing, not
# the command's, so it is a lost machine and not a user error.
[ "$outcome" = terminated ] && finish terminated "$status"
[ -n "$noticed" ] && finish lost "$status"
finish exited "$status"
