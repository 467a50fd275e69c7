#pragma once
// The `ferry` command-line tool: submit jobs, read and wait for results, show broker stats.
// main() calls RunCli; everything else lives in this library so tests can drive it.

namespace ferry::cli {

// Exit codes (also in `ferry --help`).
enum ExitCode : int {
  kExitOk = 0,           // done / accepted / printed
  kExitFailed = 1,       // job failed/expired/cancelled; submit rejected; `up`: the fleet failed
  kExitUsage = 2,        // bad flags or input files
  kExitUnavailable = 3,  // timed out, broker or Redis unreachable, queue full
  kExitPending = 4,      // `get`: no result yet
};

// Runs `ferry COMMAND [flags]`; prints to stdout/stderr and returns the exit code.
int RunCli(int argc, char** argv);

}  // namespace ferry::cli
