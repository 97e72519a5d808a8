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
#   QLACTORS_DROPPED       sidecar receiving the dropped byte count (only under a cap)
#   QLACTORS_CWD           optional working directory of the job
#   QLACTORS_CLOCK_BASE_MS wall ms minus uptime ms at spawn; the clock is base + uptime
# Exit status: always the job's ($? of the job; 128+N if signal N killed it; 126 if its
# working directory cannot be entered). A failed publication never changes it.

# Until the job runs TERM/INT/HUP are ignored, so a stop arriving now cannot kill the helpers
# (mv, mkfifo) or the log reader, which is forked with them ignored on purpose.
trap '' TERM INT HUP
umask 077
# The launcher itself says nothing (dash would print "Terminated" for a killed job, and helpers
# their errors): the job's output goes to the log, the launcher's result is the receipt.
exec >/dev/null 2>&1

q_run=${QLACTORS_RUN_ID-} q_attempt=${QLACTORS_ATTEMPT_ID-} q_token=${QLACTORS_TOKEN-}
q_rdir=${QLACTORS_RECEIPT_DIR-} q_marker=${QLACTORS_MARKER-} q_log=${QLACTORS_LOG:-/dev/null}
q_cap=${QLACTORS_LOG_CAP-} q_dropped=${QLACTORS_DROPPED-} q_cwd=${QLACTORS_CWD-}
q_base=${QLACTORS_CLOCK_BASE_MS-}
unset QLACTORS_RUN_ID QLACTORS_ATTEMPT_ID QLACTORS_TOKEN QLACTORS_RECEIPT_DIR QLACTORS_MARKER \
    QLACTORS_LOG QLACTORS_LOG_CAP QLACTORS_DROPPED QLACTORS_CWD QLACTORS_CLOCK_BASE_MS

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

# Start marker, published (temp + mv) before the job starts. Without it the executor still
# has the identity it read itself, so a failure here does not stop the job.
if [ -n "$q_marker" ] && q_identity; then
    printf 'pid=%s pgid=%s start_ticks=%s boot_id=%s\n' "$$" "$q_pgid" "$q_ticks" "$q_boot" \
        >"$q_marker.$$.tmp" && mv -f "$q_marker.$$.tmp" "$q_marker" ||
        rm -f "$q_marker.$$.tmp"
fi

# Under a cap the job writes into a FIFO in a private directory; a background reader keeps
# the first CAP bytes, then drains and counts the rest, so the job never sees SIGPIPE. The
# reader opens its end first (in the background); the job's redirection then opens the other.
# If the FIFO cannot be made, the job writes straight onto the log (uncapped, not unrun).
q_fifo= q_reader=
if [ "$q_cap" != 0 ] && [ -n "${q_marker:-$q_rdir}" ]; then
    q_tmpd=${q_marker:-$q_rdir/.$q_attempt}.$$.d
    if mkdir "$q_tmpd" && mkfifo "$q_tmpd/out"; then
        q_fifo=$q_tmpd/out
        {
            # Ignored (already inherited as ignored): TERM/INT/HUP stay ignored in dd and wc,
            # so the reader ends only at end of input.
            trap '' TERM INT HUP
            # Copy up to the cap one read at a time: each `dd count=1` writes what one read
            # returned at once (head buffers through stdio, so a running job's output would not
            # reach its log, and a KILL would lose it). dd's report, last line first word, is
            # the byte count in GNU and busybox alike; 0 means end of input.
            q_left=$q_cap
            while [ "$q_left" -gt 0 ]; do
                q_out=$(LC_ALL=C dd bs=$((q_left < 65536 ? q_left : 65536)) count=1 2>&1 >>"$q_log")
                q_out=${q_out##*"
"}
                q_out=${q_out%% *}
                case $q_out in '' | 0 | *[!0-9]*) break ;; esac
                q_left=$((q_left - q_out))
            done
            q_n=$(wc -c)
            q_uint "${q_n##* }"
            if [ -n "$q_dropped" ]; then
                printf '%s\n' "$q_n" >"$q_dropped.$$.tmp" &&
                    mv -f "$q_dropped.$$.tmp" "$q_dropped" ||
                    rm -f "$q_dropped.$$.tmp"
            fi
        } <"$q_fifo" &
        q_reader=$!
    else
        rm -rf "$q_tmpd"
    fi
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
# The job is over: ignore TERM/INT/HUP again so a late stop cannot kill sync, ln or mv.
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
    rm -rf "$q_tmpd"
fi

# Receipt (SEMANTICS.md §5): unique temp in the same directory, read back, fsync, hard link
# to the final name (never replaces one), unlink the temp, fsync the directory. Any failure
# leaves no file of ours behind.
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
    if [ "$q_back" = "$q_json" ] && sync "$q_tmp" && ln "$q_tmp" "$q_final"; then
        rm -f "$q_tmp"
        sync "$q_rdir"
    fi
    rm -f "$q_tmp"
fi

exit "$q_status"
