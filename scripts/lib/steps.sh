# Sourced by scripts/demand-agree, scripts/calib-loop and
# scripts/has-vs-exhaustive: their argument checks, and timed steps with
# their output in one log. Before sourcing, set
# `script` (the caller's name for its messages); before the first step, `log`
# (the log file) and `steps` (the steps table).

# need FLAG ARGS...: exit 2 unless a value follows FLAG
need() { [ $# -ge 2 ] || { echo "$script: $1 needs a value" >&2; exit 2; }; }

# here PATH: PATH as the caller means it (relative to the folder the script
# was started in, before it moves to the repository's root)
here() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime; }

# step NAME CMD...: run CMD with its output in the log, timed in the steps
# table; stop the script (exit 1) naming the step when it fails
step() {
    local name="$1"; shift
    local t0 t1 status
    t0=$(date +%s.%N)
    echo "== $name: $*" >> "$log"
    "$@" >> "$log" 2>&1
    status=$?
    t1=$(date +%s.%N)
    printf '%s\t%.1f\t%s\n' "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$status" >> "$steps"
    if [ "$status" -ne 0 ]; then
        echo "$script: step '$name' failed (exit $status); see $log" >&2
        exit 1
    fi
}

# to FILE CMD...: run CMD with its stdout in FILE
to() { local f="$1"; shift; "$@" > "$f"; }
