#!/usr/bin/env python3
"""Prints the benchmark table from a bench/run.sh results directory (one JSON per run)."""
import json
import os
import statistics
import sys

ORDER = ["tiny_closed", "tiny_light", "tiny_light_run", "tiny_light_no_push", "tiny_light_pinned"] + [
    f"{m}_{k}_r{r}" for m in ("encoder", "resnet", "resnet_u8") for r in range(1, 10)
    for k in ("raw", "fleet", "fleet_i2")
] + [f"whisper_raw_b{b}" for b in (4, 8, 16, 32, 64, 128)] + [
    f"whisper_{k}_r{r}" for r in range(1, 10) for k in ("raw", "fleet", "fleet_i2")
] + ["seed_maxbatch16", "seed_maxbatch1",
     "ceiling_w1", "ceiling_w2", "ceiling_w4", "ceiling_w8", "bytes"] + [
    f"{n}_r{r}" for r in range(1, 10)
    for n in ("audio", "audio_unix", "audio_attached", "audio_no_journal", "audio_out")]


def raw_of(name):
    """The raw run a fleet run is compared with: encoder_fleet_i2_r2 -> encoder_raw_r2."""
    if "_fleet" not in name:
        return None
    return name.replace("_fleet_i2", "_raw").replace("_fleet", "_raw")


def redis_cpu(floor):
    """' (Redis CPU a SET 250 us, a GET 280 us)' when the floor measured it (ferry-floor reads
    the server's INFO cpu), else ''."""
    set_us, get_us = floor.get("redis_set_cpu_us", -1), floor.get("redis_get_cpu_us", -1)
    if set_us < 0 or get_us < 0:
        return ""
    return f" (Redis CPU a SET {set_us:.0f} us, a GET {get_us:.0f} us)"


def hop_cpu(floor):
    """'; CPU us a message: producer P, relay R, consumer C' for the two hops, when measured."""
    cpu = floor.get("zmq_two_hops_cpu_us")
    if not cpu:
        return ""
    return (f"; CPU us a message: producer {cpu['producer']:.0f}, relay {cpu['relay']:.0f},"
            f" consumer {cpu['consumer']:.0f} ({sum(cpu.values()):.0f})")


def main(out):
    runs = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".json") and f != "machine.json" and not f.startswith("floor"):
            runs[f[:-5]] = json.load(open(os.path.join(out, f)))
    # floor_rN.json is measured before round N's runs, floor_rN_end.json after them: each run is
    # compared with the mean of its round's two (the floor moves with the machine's other load).
    # floor_rN_ipc.json (over ipc://, Redis over its socket) is shown beside audio_unix alone.
    floors = {f[len("floor_"):-5]: json.load(open(os.path.join(out, f)))
              for f in sorted(os.listdir(out)) if f.startswith("floor_r") and f.endswith(".json")}
    two_hops = {}  # "r1": the TCP floors of round 1; "r1_ipc": its ipc ones
    for rnd, floor in floors.items():
        if floor.get("zmq_two_hops_mbps", 0) > 0:  # a failed floor run counts for nothing
            two_hops.setdefault(rnd.removesuffix("_end"), []).append(floor["zmq_two_hops_mbps"])
    names = [n for n in ORDER if n in runs] + sorted(n for n in runs if n not in ORDER)
    machine = json.load(open(os.path.join(out, "machine.json")))
    print(f"machine: {machine['machine']}; git {machine['git']}")
    head = (f"{'run':<17}{'mode':>7}{'jobs/s':>10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
            f"{'max ms':>9}{'batch':>7}{'vs raw':>8}  cpu us/job broker/redis/workers/bench")
    print(head)
    print("-" * len(head))
    ratios = {}
    for n in names:
        r = runs[n]
        ratio = ""
        raw = runs.get(raw_of(n) or "")
        if raw and raw["throughput"] > 0:
            x = r["throughput"] / raw["throughput"]
            key = n.rsplit("_r", 1)[0].replace("_fleet", " fleet")
            ratios.setdefault(key, []).append(x)
            ratio = f"{100 * x:.0f}%"
        cpu = r.get("cpu_us_per_job")
        cpu_text = ("/".join(f"{cpu[k]:.0f}" for k in ("broker", "redis", "workers", "bench"))
                    if cpu else "")
        mode = r.get("mode", "")
        if mode == "open":
            mode = f"{r.get('rate', 0):.0f}/s"
        elif mode == "closed":
            mode = f"C={r.get('concurrency', '')}"
        elif mode == "closed-run":  # Client::Run: submit and wait in one call
            mode = f"C={r.get('concurrency', '')} Run"
        print(f"{n:<20}{mode:>7}{r['throughput']:>10.0f}{r['p50_ms']:>9.3f}{r.get('p95_ms', 0):>9.3f}"
              f"{r['p99_ms']:>9.3f}{r['max_ms']:>9.2f}{r['batch_size_mean']:>7.1f}{ratio:>8}  {cpu_text}"
              + ("" if r.get("failed", 0) == 0 else f"  FAILED {r['failed']}")
              + (f"  [other load {r['foreign_cores']:.2f} cores]"
                 if r.get("foreign_cores", 0) >= 0.1 else ""))
    for model, xs in ratios.items():
        xs = sorted(xs)
        print(f"{model} / raw: median {100 * statistics.median(xs):.0f}% over {len(xs)} round(s)"
              f" (min {100 * xs[0]:.0f}%, max {100 * xs[-1]:.0f}%)")
    speech = [n for n in names if n.startswith("whisper")]
    if speech:
        print()
        print("speech (whisper.pt, int16 16 kHz clips): audio seconds transcribed per second")
    for n in speech:
        r = runs[n]
        clip_s = int(r["shape"].split(",")[0]) / 16000
        print(f"  {n:<20} {r['throughput'] * clip_s:8.1f} audio s/s  ({clip_s:g} s clips,"
              f" {r['throughput']:.1f} clips/s, batch {r['batch_size_mean']:.1f})")
    big = [n for n in names if runs[n].get("input_mbps") is not None and n.startswith("audio")]
    if floors or big:
        print()
        print("big messages, MB/s (10^6 bytes/s); each run against its own round's floor"
              " (the mean of the floors before and after the round):")
    for rnd, floor in floors.items():
        print(f"  floor {rnd} ({floor.get('bytes')} bytes, {floor.get('transport', 'tcp')}): zmq two hops"
              f" {floor.get('zmq_two_hops_mbps', 0):.0f}, one hop {floor.get('zmq_one_hop_mbps', 0):.0f}; redis SET"
              f" {floor.get('redis_set_mbps', 0):.0f}, GET {floor.get('redis_get_mbps', 0):.0f}{redis_cpu(floor)}"
              f"{hop_cpu(floor)}")
    shares = {}
    for n in big:
        r = runs[n]
        mbps = max(r["input_mbps"], r["output_mbps"])
        way = "in" if r["input_mbps"] >= r["output_mbps"] else "out"
        base, _, rnd = n.rpartition("_")
        floor = sum(two_hops.get(rnd, [0])) / len(two_hops.get(rnd, [0]))
        vs = ""
        if floor > 0:
            x = mbps / floor
            shares.setdefault(base, []).append(x)
            vs = f"  {100 * x:.0f}% of the zmq two-hop floor"
        ipc = two_hops.get(f"{rnd}_ipc", [])
        if base == "audio_unix" and ipc:
            ipc = sum(ipc) / len(ipc)
            shares.setdefault("audio_unix (of the ipc floor)", []).append(mbps / ipc)
            vs += f", {100 * mbps / ipc:.0f}% of the ipc one"
        cpu = r.get("cpu_us_per_job") or {}
        if cpu:  # beside the floor's CPU per message: the same bytes, Ferry's processes
            vs += f"; CPU us a job {sum(v for v in cpu.values() if v > 0):.0f} in all"
            moved = max(r.get("input_bytes_per_job") or 0, r.get("output_bytes_per_job") or 0)
            # The broker's target: <= 0.2 ns a byte through it, a few us a job by claim check.
            if cpu.get("broker", 0) > 0 and moved > 0:
                per_byte = 1000 * cpu["broker"] / moved
                vs += f", broker {cpu['broker']:.0f} ({per_byte:.2f} ns per byte of the job)"
        print(f"  {n:<20} {mbps:8.0f} MB/s {way}  ({r['throughput']:.0f} jobs/s){vs}")
    for base, xs in shares.items():
        xs = sorted(xs)
        print(f"{base} / floor: median {100 * statistics.median(xs):.1f}% over {len(xs)} round(s)"
              f" (min {100 * xs[0]:.0f}%, max {100 * xs[-1]:.0f}%)")


if __name__ == "__main__":
    main(sys.argv[1])
