# Shared by the bench scripts (source it): free ports and stopping what a script started.

# A TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# stop_pids_and_remove DIR: SIGTERM to every pid in the PIDS array, SIGKILL to those still there
# half a second later, then removes DIR (the script's work directory).
stop_pids_and_remove() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$1"
}
