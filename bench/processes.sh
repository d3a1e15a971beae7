# Sourced by the bench/compare_*.sh scripts: waiting for the processes of one config.
# The sourcing script defines fail_run NAME STATUS LOG (report, then exit).

# Waits for the processes of config $1, whose pids are in the caller's array `pids`,
# each logging to $2, or else to $WORK/$1.K.log in the order of `pids`; when one fails,
# stops the others and calls fail_run with the failed one's status and log.
wait_all_or_fail() {
  local config=$1 remaining pid done_pid rc=0 k
  local -A log_of=()
  for k in "${!pids[@]}"; do log_of[${pids[$k]}]=${2:-$WORK/$config.$k.log}; done
  while ((${#pids[@]} > 0)); do
    wait -n -p done_pid "${pids[@]}" || rc=$?
    remaining=()
    for pid in "${pids[@]}"; do [[ $pid == "$done_pid" ]] || remaining+=("$pid"); done
    pids=("${remaining[@]}")
    if ((rc != 0)); then
      ((${#pids[@]} == 0)) || kill "${pids[@]}" 2>/dev/null || true
      wait "${pids[@]}" 2>/dev/null || true
      fail_run "$config" "$rc" "${log_of[$done_pid]}"
    fi
  done
}
