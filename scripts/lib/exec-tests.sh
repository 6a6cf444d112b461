# Sourced by .ci/run and scripts/gpu-check: the packages and features of
# the executor's test build, in one array, `exec_tests`.
#
# Every cargo command after the README's `cargo test` that builds the
# executor selects exactly these packages and features, and picks what it
# runs by test target and test-name filters only. Cargo unifies the
# features of shared dependencies over the selected packages and the
# dev-dependencies of those whose test targets it builds, so two commands
# that select different packages, or build no test target of the root
# package (`--lib` alone, `--doc`: the root package has no library), resolve
# different features (the root package's dev-dependencies turn on
# `regex/std` and `futures-util/io`, for example) and rebuild burn and
# everything above it: about 8 min of a 2-core CI run each time
# (2026-12-06). So a command that runs the libraries' tests adds `--bins`
# (the root package's binary, whose unit tests are none), and the
# executor's doc tests are not run (the model's two under `nn`).
exec_tests=(
    -p easerve -p easerve-exec -p easerve-worker -p easerve-model -p easerve-bench
    --features easerve/exec,easerve-model/nn
)

# The integration test files of the executor's crates, as `--test NAME`
# arguments (the root package's are run by name by their callers).
exec_crate_tests=()
for f in exec/tests/*.rs worker/tests/*.rs model/tests/*.rs bench/tests/*.rs; do
    if [ -e "$f" ]; then exec_crate_tests+=(--test "$(basename "$f" .rs)"); fi
done
