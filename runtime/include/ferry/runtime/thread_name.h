#pragma once
// Names the calling thread, so that `top -H`, `ps -L`, /proc/PID/task/*/comm, perf and gdb say
// which of a process's threads does what ("ferry-exec-0", "ferry-link"). Linux keeps 15 bytes of
// a name: longer ones are cut there. Best effort: a failure changes nothing else.

#include <string>

namespace ferry::runtime {

void NameThisThread(const std::string& name);

// The calling thread's name, as the kernel keeps it ("" where it cannot be read).
std::string ThisThreadName();

}  // namespace ferry::runtime
