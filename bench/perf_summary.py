#!/usr/bin/env python3
"""Summarizes `perf script -F comm,pid,tid,ip,sym,dso` (a machine-wide cpu-clock profile taken by
bench/run.sh --perf) per process: its share of the samples, split by library, then its top
symbols. The process name is the comm of its main thread (tid == pid)."""
import collections
import re
import sys



def main():
    by_proc = collections.Counter()
    by_dso = collections.defaultdict(collections.Counter)
    by_sym = collections.defaultdict(collections.Counter)
    by_thread = collections.defaultdict(collections.Counter)
    names = {}
    total = 0
    for line in sys.stdin:
        # "comm pid/tid sym (dso)"; sym may contain spaces, so split from both ends.
        m = re.match(r"^\s*(.+?)\s+(\d+)/(\d+)\s+(.*)$", line.rstrip("\n"))
        if not m:
            continue
        comm, pid, tid, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        dso_m = re.search(r"\(([^()]*)\)\s*$", rest)
        dso = dso_m.group(1) if dso_m else "?"
        sym = rest[:dso_m.start()].strip() if dso_m else rest.strip()
        sym = re.sub(r"^[0-9a-f]+\s*", "", sym)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym) or "?"
        dso = dso.rsplit("/", 1)[-1]
        if pid == tid:
            names[pid] = comm
        total += 1
        by_proc[pid] += 1
        by_dso[pid][dso] += 1
        by_sym[pid][f"{sym}  [{dso}]"] += 1
        by_thread[pid][comm] += 1
    if not total:
        print("no samples")
        return
    print(f"{total} samples (cpu-clock, all CPUs); % of all samples")
    for pid, n in by_proc.most_common():
        if n / total < 0.01:
            continue
        name = names.get(pid, "idle" if pid == 0 else f"pid{pid}")
        threads = ", ".join(f"{t} {100 * c / total:.1f}%" for t, c in by_thread[pid].most_common(6))
        print(f"\n{name} (pid {pid}): {100 * n / total:.1f}%   threads: {threads}")
        print("  by library: " + ", ".join(
            f"{d} {100 * c / total:.1f}%" for d, c in by_dso[pid].most_common(6)))
        for sym, c in by_sym[pid].most_common(14):
            print(f"  {100 * c / total:5.1f}%  {sym[:150]}")


if __name__ == "__main__":
    main()
