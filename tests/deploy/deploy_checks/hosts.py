"""Running Ferry on a host: the systemd unit templates and the units cmake configured from them
(the install's bin dir, `systemd-analyze verify` where it can run), what `cmake --install`
puts in a prefix, and the ferry-launch-gpus.sh launcher (one worker per device, each with its
own name and metrics port)."""
import os
import re
import shutil
import subprocess
import tempfile

from .report import note, problem


UNITS = ("ferry-broker.service", "ferry-worker@.service")


def check_systemd(deploy, units_dir, bindir):
    for unit in UNITS:
        u = os.path.join(deploy, "systemd", unit + ".in")
        if not os.path.exists(u):
            problem(u, "missing (the unit template that cmake configures)")
            continue
        text = open(u).read()
        for need in ("[Unit]", "[Service]", "[Install]", "ExecStart=@FERRY_BINDIR@/",
                     "KillSignal=SIGTERM", "LoadCredential=", "--curve-secret %d/"):
            if need not in text:
                problem(u, f"no {need}")
        if "/usr/local/bin" in text.replace("#", "\n#").split("[Unit]", 1)[-1].split("\n#")[0]:
            problem(u, "hard-codes /usr/local/bin")
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("ExecStart=") and "/usr/local/" in s:
                problem(u, "ExecStart hard-codes /usr/local")
            if s.startswith("Documentation="):
                for d in s.split("=", 1)[1].split():
                    if not (d.startswith("file://@FERRY_DOC_DIR@/") or d.startswith("https://")
                            or d.startswith("man:")):
                        problem(u, f"Documentation={d} is neither installed nor a URL")
            if s and not s.startswith(("#", ";", "[")) and "=" not in s:
                problem(u, f"not Key=Value: {s}")
        if unit == "ferry-broker.service" and "ExecReload=" not in text:
            problem(u, "no ExecReload= (SIGHUP reloads the allow dirs)")
    if not units_dir:
        note("no --units: configured units not checked")
        return
    configured = [os.path.join(units_dir, u) for u in UNITS]
    for c in configured:
        if not os.path.exists(c):
            problem(c, "not configured by cmake")
            return
        text = open(c).read()
        if "@" + "FERRY_" in text:
            problem(c, "an unconfigured @FERRY_...@ is left")
        execs = re.findall(r"^ExecStart=(\S+)", text, re.M)
        want = os.path.join(bindir, os.path.basename(c).split("@")[0].split(".")[0])
        if execs != [want]:
            problem(c, f"ExecStart runs {execs}, want {want} (the install's bin dir)")
    tool = shutil.which("systemd-analyze")
    if not tool:
        note("systemd-analyze not found; checked unit syntax only")
        return
    # Verify copies whose ExecStart binaries are replaced by /bin/true (the real ones exist only
    # after `cmake --install`), and the template as instance 0.
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for c in configured:
            text = re.sub(re.escape(bindir) + r"/ferry-[a-z-]+", "/bin/true", open(c).read())
            name = os.path.basename(c).replace("@.service", "@0.service")
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
            paths.append(os.path.join(tmp, name))
        with open(os.path.join(tmp, "ferry-worker@.service"), "w") as f:
            f.write(open(os.path.join(tmp, "ferry-worker@0.service")).read())
        r = subprocess.run([tool, "verify", "--man=no"] + paths, capture_output=True, text=True,
                           cwd=tmp)
        out = (r.stdout + r.stderr).strip()
        # In containers without systemd as PID 1 some environment notes are printed; only
        # lines naming our units count.
        ours = [l for l in out.splitlines() if "ferry" in l]
        if r.returncode != 0 or ours:
            if "Failed to" in out and not ours and r.returncode != 0:
                note(f"systemd-analyze cannot run here ({out.splitlines()[0]}); "
                     "checked unit syntax only")
            else:
                problem("systemd", "systemd-analyze verify: " + (out or f"rc {r.returncode}"))
        else:
            note("systemd-analyze verify passed")


def check_install(cmake, build):
    """`cmake --install BUILD --prefix P` puts units that run P/bin's binaries and point at docs
    that P holds."""
    if not (cmake and build):
        note("no --cmake/--build-dir: the installed units not checked")
        return
    with tempfile.TemporaryDirectory() as prefix:
        r = subprocess.run([cmake, "--install", build, "--component", "deploy", "--prefix", prefix],
                           capture_output=True, text=True)
        if r.returncode != 0:
            problem("install", f"cmake --install --component deploy: {r.stderr.strip()[:400]}")
            return
        for unit in UNITS:
            path = os.path.join(prefix, "lib", "systemd", "system", unit)
            if not os.path.exists(path):
                problem("install", f"no {unit} in PREFIX/lib/systemd/system")
                continue
            text = open(path).read()
            prog = unit.split("@")[0].split(".")[0]
            execs = re.findall(r"^ExecStart=(\S+)", text, re.M)
            if execs != [os.path.join(prefix, "bin", prog)]:
                problem("install", f"{unit}: ExecStart runs {execs}, not PREFIX/bin/{prog}")
            for doc in re.findall(r"file://(\S+)", "\n".join(
                    l for l in text.splitlines() if l.startswith("Documentation="))):
                if not os.path.exists(doc):
                    problem("install", f"{unit}: Documentation {doc} is not installed")


def check_launcher(deploy):
    script = os.path.join(deploy, "ferry-launch-gpus.sh")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1,2")
    r = subprocess.run(["bash", script, "--dry-run", "--worker-bin", "/x/ferry-worker", "--",
                        "--broker", "tcp://b:5556", "--name", "n", "--metrics-port", "9460",
                        "--model", "tiny=/models/tiny.pt"], capture_output=True, text=True,
                       env=env)
    lines = [l for l in r.stdout.splitlines() if "/x/ferry-worker" in l]
    if r.returncode != 0 or len(lines) != 3:
        problem("ferry-launch-gpus.sh", f"--dry-run with 3 GPUs: rc {r.returncode}: {r.stdout}"
                f"{r.stderr}")
        return
    for k, line in enumerate(lines):
        for want in (f"CUDA_VISIBLE_DEVICES={k} ", f"--name n-gpu{k}", f"--metrics-port {9460 + k}",
                     "--device cuda:0"):
            if want not in line + " ":
                problem("ferry-launch-gpus.sh", f"worker {k}: no '{want.strip()}' in: {line}")

    # --metrics-port 0 (metrics off) stays 0 for every worker; it was made 1, 2, ...:
    # privileged ports, whose bind failed and stopped the launcher.
    r = subprocess.run(["bash", script, "--dry-run", "--worker-bin", "/x/ferry-worker", "--",
                        "--metrics-port", "0"], capture_output=True, text=True, env=env)
    lines = [l for l in r.stdout.splitlines() if "/x/ferry-worker" in l]
    if r.returncode != 0 or len(lines) != 3 or \
            any(not (l + " ").count("--metrics-port 0 ") == 1 for l in lines):
        problem("ferry-launch-gpus.sh", f"--metrics-port 0 with 3 GPUs: rc {r.returncode}: "
                f"{r.stdout}{r.stderr}")

    # A negative entry in CUDA_VISIBLE_DEVICES hides itself and every entry after it, as CUDA
    # reads it: "2,-1,0" is GPU 2 alone (before, -1 alone was dropped: GPUs 2 and 0).
    r = subprocess.run(["bash", script, "--dry-run", "--worker-bin", "/x/ferry-worker"],
                       capture_output=True, text=True,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES="2, -1,0"))
    lines = [l for l in r.stdout.splitlines() if "/x/ferry-worker" in l]
    if r.returncode != 0 or len(lines) != 1 or "CUDA_VISIBLE_DEVICES=2 " not in lines[0]:
        problem("ferry-launch-gpus.sh", f"CUDA_VISIBLE_DEVICES='2, -1,0': rc {r.returncode}: "
                f"{r.stdout}{r.stderr}")

    # A worker that ends on its own (crashed) while others run: the launcher stops the others
    # (SIGTERM: they drain) and exits 1, so that its supervisor restarts it; before, it waited
    # on, alive, with that device idle. A stub stands in for ferry-worker: cpu0 exits 3.
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "ferry-worker")
        with open(stub, "w") as f:
            f.write("#!/bin/bash\n"
                    "name=; while [ $# -gt 0 ]; do [ \"$1\" = --name ] && name=$2; shift; done\n"
                    "[ \"$name\" = s-cpu0 ] && { sleep 0.5; exit 3; }\n"
                    "trap 'echo drained; exit 0' TERM\n"
                    "while true; do sleep 0.1; done\n")
        os.chmod(stub, 0o755)
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi: CPU workers
        try:
            r = subprocess.run(["bash", script, "--cpu-workers", "2", "--worker-bin", stub, "--",
                                "--name", "s"], capture_output=True, text=True, env=env,
                               timeout=60)
        except subprocess.TimeoutExpired:
            problem("ferry-launch-gpus.sh", "a worker crashed and the launcher kept running")
            return
        out = r.stdout + r.stderr
        if r.returncode != 1 or "cpu0 stopped on its own" not in out or \
                "[cpu1] drained" not in out:
            problem("ferry-launch-gpus.sh", f"a worker crashed: rc {r.returncode}: {out}")
