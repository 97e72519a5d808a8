# qlactors launcher: run one job, keep its log under a cap, publish its completion receipt.
# Run as `/bin/sh launcher.sh ARGV...` in its own session (SEMANTICS.md §4-§5, §7, §11).
# POSIX sh only: it must behave the same under dash and busybox sh, and cost next to nothing.
#
# The callback token comes on descriptor 3 (one line, read once, then closed; a single digit,
# since dash redirects only descriptors 0-9): it is never in the launcher's environment, which
# /proc/PID/environ shows for its whole life.
# Environment (every QLACTORS_* below is removed before the job runs):
#   QLACTORS_RUN_ID, QLACTORS_ATTEMPT_ID   receipt fields
#   QLACTORS_RECEIPT_DIR   shard directory; the receipt is DIR/ATTEMPT_ID.json
#   QLACTORS_MARKER        start-marker path (published before the job starts)
#   QLACTORS_LOG           log file, appended to only
#   QLACTORS_LOG_CAP       bytes of output to keep; 0 or unset = no cap
#   QLACTORS_FIFO          FIFO made by the executor (0600) for the cap; not a FIFO = no cap
#   QLACTORS_DROPPED       sidecar receiving the dropped byte count (a cap needs one)
#   QLACTORS_CWD           optional working directory of the job
#   QLACTORS_CLOCK_BASE_MS wall ms minus uptime ms at spawn; the clock is base + uptime
#   QLACTORS_STOP_GRACE_MS TERM to KILL for what the job left in its group (default 1000)
#   QLACTORS_KEEP_LEFTOVERS 1 = leave what the job left in its group running
#   QLACTORS_DRAIN_MS      how long the log-cap reader may take after that (default 1000)
# The job runs in a process group (and session) of its own, made by `setsid`: job control,
# which would make a group inside this session, needs a terminal in dash and busybox.
# Exit status: always the job's ($? of the job; 128+N if signal N killed it; 126 if its
# working directory cannot be entered). A failed publication never changes it.
# Every external program costs an exec (~1 ms of CPU): a job with little output runs only dd,
# setsid, the job, and ln, rm, sync for the receipt; everything else is a shell builtin (plus a
# short sleep while something the job left behind is being stopped or the reader finishes).

# Until the job runs TERM/INT/HUP are ignored, so a stop arriving now cannot kill the launcher
# before the job runs, nor the log reader, which is forked with them ignored on purpose.
trap '' TERM INT HUP
umask 077
# The launcher itself says nothing (dash would print "Terminated" for a killed job, and helpers
# their errors): the job's output goes to the log, the launcher's result is the receipt.
exec >/dev/null 2>&1

# unset, not just assigned: a variable the environment brought in stays exported, and the job
# would inherit the token (a task cannot name one q_*, but the launcher does not rely on that).
unset q_token
IFS= read -r q_token <&3
exec 3<&-
q_run=${QLACTORS_RUN_ID-} q_attempt=${QLACTORS_ATTEMPT_ID-}
q_rdir=${QLACTORS_RECEIPT_DIR-} q_marker=${QLACTORS_MARKER-} q_log=${QLACTORS_LOG:-/dev/null}
q_cap=${QLACTORS_LOG_CAP-} q_dropped=${QLACTORS_DROPPED-} q_cwd=${QLACTORS_CWD-}
q_base=${QLACTORS_CLOCK_BASE_MS-} q_fifo=${QLACTORS_FIFO-} q_keep=${QLACTORS_KEEP_LEFTOVERS-}
q_grace=${QLACTORS_STOP_GRACE_MS-1000} q_drain=${QLACTORS_DRAIN_MS-1000}
unset QLACTORS_RUN_ID QLACTORS_ATTEMPT_ID QLACTORS_RECEIPT_DIR QLACTORS_MARKER QLACTORS_LOG \
    QLACTORS_LOG_CAP QLACTORS_FIFO QLACTORS_DROPPED QLACTORS_CWD QLACTORS_CLOCK_BASE_MS \
    QLACTORS_STOP_GRACE_MS QLACTORS_KEEP_LEFTOVERS QLACTORS_DRAIN_MS

# The launcher's own tools come from the standard places first, so a task's PATH cannot break
# the receipt; the job gets its own PATH back untouched.
q_path_set=${PATH+1} q_path=${PATH-}
PATH=/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}
q_setsid=
for q_dir in /usr/bin /bin /usr/sbin /sbin; do
    if [ -x "$q_dir/setsid" ]; then q_setsid=$q_dir/setsid; break; fi
done

# Digits only, without leading zeros (octal), else 0: garbage in $((...)) would abort the
# shell and lose the receipt.
q_uint() {
    case $1 in '' | *[!0-9]*) q_n=0 ;; *) q_n=$1 ;; esac
    while :; do case $q_n in 0?*) q_n=${q_n#0} ;; *) break ;; esac; done
}
q_uint "$q_base"; q_base=$q_n
q_uint "$q_cap"; q_cap=$q_n
q_uint "$q_grace"; q_grace=$q_n
q_uint "$q_drain"; q_drain=$q_n

# q_ms = base + /proc/uptime ("12345.67" s) in ms, with builtins only: busybox date has no
# sub-second format, and both receipt times must come from this one clock.
q_clock() {
    q_up=
    read -r q_up q_rest </proc/uptime
    q_uint "${q_up%%.*}"; q_s=$q_n
    case $q_up in *.*) q_cs=${q_up#*.} ;; *) q_cs=0 ;; esac
    case $q_cs in ?) q_cs=${q_cs}0 ;; ???*) q_cs=${q_cs%"${q_cs#??}"} ;; esac
    q_uint "$q_cs"
    q_ms=$((q_base + q_s * 1000 + q_n * 10))
}

# Process group and start ticks of the /proc/PID/stat line in $q_stat, into q_fpgid and
# q_fticks: fields 5 and 22, counted after the last ')' since a command name may hold spaces
# and parens. A function, to keep "$@" intact.
q_stat_fields() {
    set -f
    set -- ${q_stat##*[)]}
    set +f
    [ $# -ge 20 ] || return 1
    q_fpgid=$3 q_fticks=${20}
    case $q_fpgid$q_fticks in '' | *[!0-9]*) return 1 ;; esac
}
# Our own identity: process group, start ticks and the boot id.
q_identity() {
    q_pgid= q_ticks= q_stat= q_boot=
    read -r q_stat <"/proc/$$/stat" || return 1
    read -r q_boot </proc/sys/kernel/random/boot_id || return 1
    q_stat_fields || return 1
    q_pgid=$q_fpgid q_ticks=$q_fticks
    [ -n "$q_boot" ]
}

# Start marker, published by the job's own process just before it execs the job (so it names
# the job's process group too: pid = group = the job's main process). Written in place by the
# printf builtin (one short write, no temp + mv exec): a reader seeing it empty or without its
# final newline takes it as not published yet (identity.read_marker). Without it the executor
# still has the identity it read itself, so a failure here does not stop the job.
q_identity || q_marker=

# Under a cap the job writes into the FIFO the executor made (making it here would cost mkdir,
# mkfifo and rm execs); a background reader keeps the first CAP bytes, then drains and counts
# the rest, so the job never sees SIGPIPE. The reader opens its end first (in the background);
# the job's redirection then opens the other. Without a FIFO the job writes straight onto the
# log (uncapped, not unrun) and no dropped-bytes file is written.
q_reader=
if [ "$q_cap" != 0 ] && [ -n "$q_fifo" ] && [ -p "$q_fifo" ] && [ -n "$q_dropped" ]; then
    {
        # Ignored (already inherited as ignored): TERM/INT/HUP stay ignored in dd and wc, so
        # the reader ends only at end of input.
        trap '' TERM INT HUP
        # USR1 from the launcher: it gave up waiting (something outside the job's group holds
        # the FIFO open) and published without a count; a count written later would be a lie.
        trap 'q_dropped=' USR1
        # Copy up to the cap with dd, which writes what each read returned at once (head
        # buffers through stdio: a running job's output would not reach its log, and a KILL
        # would lose it; iflag=fullblock would hold short reads back too). iflag=count_bytes
        # makes count a byte limit: busybox dd copies exactly that many bytes, but GNU dd
        # counts each short read of a pipe as a record and stops after ceil(count/bs) reads,
        # perhaps short of the cap. So dd runs again until the cap or end of input; with
        # bs = cap/256 (at most 64 KiB) one GNU dd may take 256 reads, enough for a job with
        # little output. dd's report (LC_ALL=C) gives "F+P records in" and, last, "N bytes ...
        # copied" (GNU, and busybox built with its third status line). Whatever is not
        # understood (dd failed, no byte count) ends the copy with q_more set: `wc` then
        # drains and counts the rest. A dd without count_bytes refuses the operand before
        # reading anything (no "records in"): then each dd takes one read (count=1).
        q_left=$q_cap q_bs=$(((q_cap + 255) / 256)) q_more=1 q_flag=iflag=count_bytes
        [ "$q_bs" -le 65536 ] || q_bs=65536
        while :; do
            if [ -n "$q_flag" ]; then
                q_count=$q_left q_max=$(((q_left + q_bs - 1) / q_bs))
            else
                q_bs=$((q_left < 65536 ? q_left : 65536)) q_count=1 q_max=1
            fi
            if ! q_out=$(LC_ALL=C dd bs=$q_bs count=$q_count $q_flag 2>&1 >>"$q_log"); then
                case $q_out in *" records in"*) break ;; esac
                [ -n "$q_flag" ] || break
                q_flag=
                continue
            fi
            q_line=${q_out##*"
"}
            q_got=${q_line%% *}
            case $q_got in '' | *[!0-9]*) break ;; esac
            case $q_line in "$q_got byte"*) ;; *) break ;; esac
            [ "$q_got" -lt "$q_left" ] || break # the cap is reached: drain the rest
            [ "$q_got" -gt 0 ] || { q_more=; break; } # end of input
            q_line=${q_out%%" records in"*}
            q_line=${q_line##*"
"}
            q_full=${q_line%%+*}
            q_part=${q_line#"$q_full"+}
            case $q_line in "$q_full+$q_part") ;; *) break ;; esac
            case $q_full.$q_part in *[!0-9.]* | .* | *.) break ;; esac
            q_uint "$q_full"; q_reads=$q_n
            q_uint "$q_part"; q_reads=$((q_reads + q_n))
            # Fewer reads than dd was allowed: it stopped at end of input.
            if [ "$q_reads" -lt "$q_max" ]; then q_more=; break; fi
            q_left=$((q_left - q_got))
        done
        # Only when input may remain is there anything to drain and count (one more exec).
        q_n=0
        if [ -n "$q_more" ]; then
            q_n=$(LC_ALL=C wc -c)
            q_uint "${q_n##* }"
        fi
        # Written in place by the builtin: the launcher publishes the receipt only after this
        # reader ended, and the consumer reads this file only once the receipt exists.
        if [ -n "$q_dropped" ]; then printf '%s\n' "$q_n" >"$q_dropped"; fi
    } <"$q_fifo" &
    q_reader=$!
else
    q_fifo=
fi

# While the job runs, TERM/INT/HUP run a no-op handler: the launcher survives them to publish
# the receipt and never re-sends them. A handled trap is reset to default in the job (an
# ignored one would be inherited), and the job runs in the foreground, since a background job
# of a non-interactive shell starts with INT and QUIT ignored.
trap : TERM INT HUP
q_clock; q_started=$q_ms
(
    # /proc/self is this subshell (`read` is a builtin): the job's pid, and its group once
    # setsid has run. Marker first, so that a stop can find the group as soon as it exists;
    # without a marker nobody could name that group, so the job then stays in ours.
    q_own=
    if [ -n "$q_marker" ] && read -r q_stat </proc/self/stat && q_stat_fields; then
        q_self=${q_stat%% *}
        printf 'pid=%s pgid=%s start_ticks=%s boot_id=%s job_pid=%s job_start_ticks=%s\n' \
            "$$" "$q_pgid" "$q_ticks" "$q_boot" "$q_self" "$q_fticks" >"$q_marker" && q_own=1
    fi
    if [ -n "$q_path_set" ]; then PATH=$q_path; else unset PATH; fi
    if [ -n "$q_cwd" ]; then
        case $q_cwd in /*) ;; *) q_cwd=./$q_cwd ;; esac
        cd "$q_cwd" || exit 126
    fi
    if [ -n "$q_setsid" ] && [ -n "$q_own" ]; then exec "$q_setsid" -- "$@"; fi
    exec "$@"
) </dev/null >>"${q_fifo:-$q_log}" 2>&1
# A foreground job's $? is its real status: the shell runs pending traps only after it ends.
q_status=$?
q_clock; q_finished=$q_ms
# The job is over: ignore TERM/INT/HUP again so a late stop cannot kill sleep, ln, rm or sync.
trap '' TERM INT HUP

# q_wait_until CONDITION MS: run the command CONDITION until it succeeds, at most MS ms on the
# launcher's clock (short sleeps in between, only while it fails); status 1 when time ran out.
q_wait_until() {
    q_clock; q_until=$((q_ms + $2))
    while ! $1; do
        q_clock
        [ "$q_ms" -lt "$q_until" ] || return 1
        sleep 0.02
    done
}

# What the job left in its process group is stopped as a runtime stop would (TERM, the task's
# stop grace, KILL), unless the task keeps it. The group is named by the job's pid, read back
# from the marker the job's process wrote; it exists only while something is left in it (a
# group with a live member keeps its id from being reused).
# Only a marker that names this launcher counts (one left by an earlier launch of the same
# attempt would name another job).
q_job=
if [ -n "$q_marker" ] && [ -n "$q_setsid" ] && read -r q_line <"$q_marker"; then
    case $q_line in
        "pid=$$ pgid=$q_pgid start_ticks=$q_ticks boot_id=$q_boot job_pid="*)
            q_job=${q_line##*job_pid=}
            q_job=${q_job%% *}
            case $q_job in '' | *[!0-9]*) q_job= ;; esac ;;
    esac
fi
# The group is still the job's only while no process has the number $q_job: the kernel never
# hands out a pid that a live group still uses, so a process with that pid means the group
# emptied and the number was reused; it is then never signalled.
q_group_ours() { ! [ -e "/proc/$q_job" ] && kill -0 "-$q_job"; }
q_group_gone() { ! q_group_ours; }
if [ -n "$q_job" ] && [ "$q_keep" != 1 ] && q_group_ours && kill -TERM "-$q_job"; then
    q_wait_until q_group_gone "$q_grace" || { q_group_ours && kill -KILL "-$q_job"; }
fi

# The log-cap reader normally ends as soon as the job's group is gone. Something outside the
# group (a child that called setsid) may still hold the FIFO: then the receipt does not wait
# past the drain bound; it says so (outputOpen 1) and the reader is told not to write a count
# it can no longer give before the receipt (the dropped-byte count is then unknown).
q_open=0
if [ -n "$q_reader" ]; then
    # If the job died before opening the FIFO, the reader is still blocked opening its end; a
    # read-write open (never blocks on Linux) lets it through to end of input.
    : <>"$q_fifo"
    # Done once its count is written, or once it is gone (the shell reaps it while `sleep` runs).
    q_reader_done() { [ -s "$q_dropped" ] || ! kill -0 "$q_reader"; }
    if q_wait_until q_reader_done "$q_drain"; then
        # Wait until the reader really ended (a signal can cut `wait` short).
        while :; do
            wait "$q_reader"
            [ $? -gt 128 ] || break
            kill -0 "$q_reader" || break
        done
    else
        kill -USR1 "$q_reader"
        q_open=1
        # It may have written its count just before: then it did finish in time.
        if [ -s "$q_dropped" ]; then q_open=0; fi
    fi
fi

# Receipt (SEMANTICS.md §5): unique temp in the same directory, read back, hard link to the
# final name (never replaces one), unlink the temp, then one sync of the receipt and its
# directory (after the move, as §5 allows: a power loss in between leaves a receipt the codec
# refuses, which is quarantined, never believed). Any failure leaves no file of ours behind
# (the temp is removed once, on either path).
q_ids_ok() {
    for q_id in "$q_run" "$q_attempt"; do
        case $q_id in '' | *[!A-Za-z0-9_-]*) return 1 ;; esac
    done
    case $q_token in '' | *[!A-Za-z0-9_-]*) return 1 ;; esac
    [ -n "$q_rdir" ] && [ -d "$q_rdir" ]
}
q_final=$q_rdir/$q_attempt.json q_tmp=$q_rdir/.$q_attempt.$$.tmp
if q_ids_ok && ! [ -e "$q_final" ] && ! [ -L "$q_final" ]; then
    q_json="{\"schemaVersion\":2,\"runId\":\"$q_run\",\"attemptId\":\"$q_attempt\""
    q_json="$q_json,\"callbackSequence\":1,\"token\":\"$q_token\",\"startedAtMs\":$q_started"
    q_json="$q_json,\"finishedAtMs\":$q_finished,\"exitCode\":$q_status,\"outputOpen\":$q_open}"
    q_back=
    # read-back catches a short write; `read` fails at the missing newline, hence `|| :`.
    printf '%s' "$q_json" >"$q_tmp" && { IFS= read -r q_back <"$q_tmp" || :; }
    # LC_ALL=C: the tools skip loading the job's locale (~0.15 ms of CPU each).
    if [ "$q_back" = "$q_json" ] && LC_ALL=C ln "$q_tmp" "$q_final"; then
        LC_ALL=C rm -f "$q_tmp"
        LC_ALL=C sync "$q_final" "$q_rdir"
    else
        LC_ALL=C rm -f "$q_tmp"
    fi
fi

exit "$q_status"
