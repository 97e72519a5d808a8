# qlactors launcher: run one job, keep its log under a cap, publish its completion receipt.
# Run as `/bin/sh launcher.sh ARGV...` in its own session (SEMANTICS.md §4-§5, §7, §11).
# POSIX sh only: it must behave the same under dash and busybox sh, and cost next to nothing.
#
# Environment (every QLACTORS_* below is removed before the job runs):
#   QLACTORS_RUN_ID, QLACTORS_ATTEMPT_ID, QLACTORS_TOKEN   receipt fields
#   QLACTORS_RECEIPT_DIR   shard directory; the receipt is DIR/ATTEMPT_ID.json
#   QLACTORS_MARKER        start-marker path (published before the job starts)
#   QLACTORS_LOG           log file, appended to only
#   QLACTORS_LOG_CAP       bytes of output to keep; 0 or unset = no cap
#   QLACTORS_FIFO          FIFO made by the executor (0600) for the cap; not a FIFO = no cap
#   QLACTORS_DROPPED       sidecar receiving the dropped byte count (only under a cap)
#   QLACTORS_CWD           optional working directory of the job
#   QLACTORS_CLOCK_BASE_MS wall ms minus uptime ms at spawn; the clock is base + uptime
# Exit status: always the job's ($? of the job; 128+N if signal N killed it; 126 if its
# working directory cannot be entered). A failed publication never changes it.
# Every external program costs an exec (~1 ms of CPU): a job with little output runs only dd,
# the job, and sync, ln, rm, sync for the receipt; everything else is a shell builtin.

# Until the job runs TERM/INT/HUP are ignored, so a stop arriving now cannot kill the launcher
# before the job runs, nor the log reader, which is forked with them ignored on purpose.
trap '' TERM INT HUP
umask 077
# The launcher itself says nothing (dash would print "Terminated" for a killed job, and helpers
# their errors): the job's output goes to the log, the launcher's result is the receipt.
exec >/dev/null 2>&1

q_run=${QLACTORS_RUN_ID-} q_attempt=${QLACTORS_ATTEMPT_ID-} q_token=${QLACTORS_TOKEN-}
q_rdir=${QLACTORS_RECEIPT_DIR-} q_marker=${QLACTORS_MARKER-} q_log=${QLACTORS_LOG:-/dev/null}
q_cap=${QLACTORS_LOG_CAP-} q_dropped=${QLACTORS_DROPPED-} q_cwd=${QLACTORS_CWD-}
q_base=${QLACTORS_CLOCK_BASE_MS-} q_fifo=${QLACTORS_FIFO-}
unset QLACTORS_RUN_ID QLACTORS_ATTEMPT_ID QLACTORS_TOKEN QLACTORS_RECEIPT_DIR QLACTORS_MARKER \
    QLACTORS_LOG QLACTORS_LOG_CAP QLACTORS_FIFO QLACTORS_DROPPED QLACTORS_CWD QLACTORS_CLOCK_BASE_MS

# The launcher's own tools come from the standard places first, so a task's PATH cannot break
# the receipt; the job gets its own PATH back untouched.
q_path_set=${PATH+1} q_path=${PATH-}
PATH=/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

# Digits only, without leading zeros (octal), else 0: garbage in $((...)) would abort the
# shell and lose the receipt.
q_uint() {
    case $1 in '' | *[!0-9]*) q_n=0 ;; *) q_n=$1 ;; esac
    while :; do case $q_n in 0?*) q_n=${q_n#0} ;; *) break ;; esac; done
}
q_uint "$q_base"; q_base=$q_n
q_uint "$q_cap"; q_cap=$q_n

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

# Our process group and start ticks: fields 5 and 22 of /proc/$$/stat, counted after the
# last ')' since a command name may hold spaces and parens. A function, to keep "$@" intact.
q_identity() {
    q_pgid= q_ticks= q_stat= q_boot=
    read -r q_stat <"/proc/$$/stat" || return 1
    read -r q_boot </proc/sys/kernel/random/boot_id || return 1
    set -f
    set -- ${q_stat##*[)]}
    set +f
    [ $# -ge 20 ] || return 1
    q_pgid=$3 q_ticks=${20}
    case $q_pgid$q_ticks in *[!0-9]*) return 1 ;; esac
    [ -n "$q_boot" ]
}

# Start marker, published before the job starts. Written in place by the printf builtin (one
# short write, no temp + mv exec): a reader seeing it empty or without its final newline takes
# it as not published yet (identity.read_marker). Without it the executor still has the
# identity it read itself, so a failure here does not stop the job.
if [ -n "$q_marker" ] && q_identity; then
    printf 'pid=%s pgid=%s start_ticks=%s boot_id=%s\n' "$$" "$q_pgid" "$q_ticks" "$q_boot" \
        >"$q_marker"
fi

# Under a cap the job writes into the FIFO the executor made (making it here would cost mkdir,
# mkfifo and rm execs); a background reader keeps the first CAP bytes, then drains and counts
# the rest, so the job never sees SIGPIPE. The reader opens its end first (in the background);
# the job's redirection then opens the other. Without a FIFO the job writes straight onto the
# log (uncapped, not unrun) and no dropped-bytes file is written.
q_reader=
if [ "$q_cap" != 0 ] && [ -n "$q_fifo" ] && [ -p "$q_fifo" ]; then
    {
        # Ignored (already inherited as ignored): TERM/INT/HUP stay ignored in dd and wc, so
        # the reader ends only at end of input.
        trap '' TERM INT HUP
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
    if [ -n "$q_path_set" ]; then PATH=$q_path; else unset PATH; fi
    if [ -n "$q_cwd" ]; then
        case $q_cwd in /*) ;; *) q_cwd=./$q_cwd ;; esac
        cd "$q_cwd" || exit 126
    fi
    exec "$@"
) </dev/null >>"${q_fifo:-$q_log}" 2>&1
# A foreground job's $? is its real status: the shell runs pending traps only after it ends.
q_status=$?
q_clock; q_finished=$q_ms
# The job is over: ignore TERM/INT/HUP again so a late stop cannot kill sync, ln or rm.
trap '' TERM INT HUP

if [ -n "$q_reader" ]; then
    # If the job died before opening the FIFO, the reader is still blocked opening its end; a
    # read-write open (never blocks on Linux) lets it through to end of input.
    : <>"$q_fifo"
    # Wait until the reader really ended (a signal can cut `wait` short), so the dropped-bytes
    # file exists before the receipt does.
    while :; do
        wait "$q_reader"
        [ $? -gt 128 ] || break
        kill -0 "$q_reader" || break
    done
fi

# Receipt (SEMANTICS.md §5): unique temp in the same directory, read back, fsync, hard link
# to the final name (never replaces one), unlink the temp, fsync the directory. Any failure
# leaves no file of ours behind (the temp is removed once, on either path).
q_ids_ok() {
    for q_id in "$q_run" "$q_attempt"; do
        case $q_id in '' | *[!A-Za-z0-9_-]*) return 1 ;; esac
    done
    case $q_token in '' | *[!A-Za-z0-9_-]*) return 1 ;; esac
    [ -n "$q_rdir" ] && [ -d "$q_rdir" ]
}
q_final=$q_rdir/$q_attempt.json q_tmp=$q_rdir/.$q_attempt.$$.tmp
if q_ids_ok && ! [ -e "$q_final" ] && ! [ -L "$q_final" ]; then
    q_json="{\"schemaVersion\":1,\"runId\":\"$q_run\",\"attemptId\":\"$q_attempt\""
    q_json="$q_json,\"callbackSequence\":1,\"token\":\"$q_token\",\"startedAtMs\":$q_started"
    q_json="$q_json,\"finishedAtMs\":$q_finished,\"exitCode\":$q_status}"
    q_back=
    # read-back catches a short write; `read` fails at the missing newline, hence `|| :`.
    printf '%s' "$q_json" >"$q_tmp" && { IFS= read -r q_back <"$q_tmp" || :; }
    # LC_ALL=C: the tools skip loading the job's locale (~0.15 ms of CPU each).
    if [ "$q_back" = "$q_json" ] && LC_ALL=C sync "$q_tmp" && LC_ALL=C ln "$q_tmp" "$q_final"; then
        LC_ALL=C rm -f "$q_tmp"
        LC_ALL=C sync "$q_rdir"
    else
        LC_ALL=C rm -f "$q_tmp"
    fi
fi

exit "$q_status"
