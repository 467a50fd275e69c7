# Shared by the bench scripts (source it): free ports, CPU time, stopping what a script started.

# A TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# cpu_ns PID: nanoseconds of CPU the process's threads have used so far (schedstat's first field,
# summed over /proc/PID/task/*; /proc/PID/stat counts 10 ms ticks). 0 once PID is gone. Threads
# that already exited are not counted: measure processes whose threads live as long as they do.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }

# running PID: the process exists and has not exited (a zombie, exited but not yet reaped by
# `wait`, still answers kill -0).
running() {
  local state
  state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# reap PID SECONDS: gives PID (a child of this shell, already told to stop) up to SECONDS to
# exit, SIGKILLs it if it has not, and returns its exit status.
reap() {
  local _ rc=0
  for _ in $(seq $(( $2 * 10 ))); do running "$1" || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || rc=$?
  return "$rc"
}

# stop_pids_and_remove DIR: stops every pid in the PIDS array, the last started first (workers
# before the broker and Redis they drain into): SIGTERM, up to 5 s to exit, then SIGKILL. Then
# removes DIR (the script's work directory).
stop_pids_and_remove() {
  local i pid
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[$i]}
    kill -TERM "$pid" 2>/dev/null || continue
    reap "$pid" 5 || true
  done
  wait 2>/dev/null || true
  rm -rf "$1"
}
