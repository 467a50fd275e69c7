"""Every flag a deploy file passes to a Ferry binary is one that binary's --help lists: the
rendered Kubernetes containers, the compose services (and the `ferry ...` commands in their
shell snippets), the Dockerfiles' ENTRYPOINT + CMD, the units' ExecStart and the example
environment file."""
import json
import os
import re
import subprocess

import yaml

from .hosts import UNITS
from .k8s import WORKLOADS, pod_of
from .report import note, problem


HELP_CACHE = {}


def help_flags(binary, sub=None):
    key = (binary, sub)
    if key not in HELP_CACHE:
        argv = [binary] + ([sub] if sub else []) + ["--help"]
        r = subprocess.run(argv, capture_output=True, text=True)
        HELP_CACHE[key] = set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout + r.stderr))
    return HELP_CACHE[key]


def flags_in(argv):
    out = []
    for a in argv:
        if isinstance(a, str) and a.startswith("--") and len(a) > 2:
            out.append(a.split("=", 1)[0])
    return out


def check_flags(where, binary_name, argv, bins):
    """argv: the arguments (after the binary) a deploy file passes to binary_name."""
    if binary_name == "ferry-launch-gpus":
        argv = list(argv)
        if "--" in argv:
            argv = argv[argv.index("--") + 1:]
        binary_name = "ferry-worker"
    if binary_name == "ferry-make-models":
        return
    if binary_name.startswith("ferry "):
        binary, sub = bins.get("ferry"), binary_name.split()[1]
    else:
        binary, sub = bins.get(binary_name), None
    if not binary:
        note(f"no {binary_name.split()[0]} binary given: its flags in {where} not checked")
        return
    known = help_flags(binary, sub)
    for f in flags_in(argv):
        if f not in known:
            problem(where, f"{binary_name} has no flag {f} (not in its --help)")


def shell_ferry_commands(script):
    """`ferry SUB args...` invocations in a shell snippet (line continuations joined)."""
    script = script.replace("\\\n", " ")
    out = []
    for line in script.splitlines():
        toks = line.replace('"', " ").split()
        for i, t in enumerate(toks):
            if t == "ferry" and i + 1 < len(toks) and toks[i + 1] in ("keygen", "submit", "stats",
                                                                    "status", "wait", "get"):
                out.append(("ferry " + toks[i + 1], toks[i + 2:]))
    return out


def check_all_flags(deploy, bins, rendered, units_dir):
    # Kubernetes: each container, by its image (or its command's program).
    for rel, objects in rendered:
        for _, doc in objects:
            if doc.get("kind") not in WORKLOADS:
                continue
            pod = pod_of(doc)
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                image = c.get("image", "")
                cmd = c.get("command") or []
                prog = os.path.basename(cmd[0]) if cmd else (
                    "ferry-broker" if "ferry-broker" in image else
                    "ferry-worker" if "ferry-worker" in image else None)
                if prog and prog.startswith("ferry"):
                    check_flags(f"{rel} {doc['metadata']['name']}/{c['name']}", prog,
                                list(cmd[1:]) + list(c.get("args") or []), bins)
    # Compose.
    compose = yaml.safe_load(open(os.path.join(deploy, "docker-compose.yml")))
    for name, s in (compose.get("services") or {}).items():
        image = str(s.get("image", ""))
        entry = s.get("entrypoint") or []
        cmd = s.get("command") or []
        if isinstance(cmd, str):
            cmd = [cmd]
        if entry[:1] == ["/bin/sh"]:
            for sub, args in shell_ferry_commands("\n".join(cmd)):
                check_flags(f"docker-compose.yml {name}", sub, args, bins)
            continue
        prog = os.path.basename(entry[0]) if entry else (
            "ferry-broker" if "ferry-broker" in image else
            "ferry-worker" if "ferry-worker" in image else None)
        if prog:
            check_flags(f"docker-compose.yml {name}", prog, list(entry[1:]) + list(cmd), bins)
    # Dockerfiles: ENTRYPOINT + CMD.
    for df in ("Dockerfile.broker", "Dockerfile.worker"):
        text = open(os.path.join(deploy, "docker", df)).read().replace("\\\n", " ")
        entry = re.search(r"^ENTRYPOINT\s+(\[.*\])", text, re.M)
        cmd = re.search(r"^CMD\s+(\[.*\])", text, re.M)
        if entry and cmd:
            e = json.loads(entry.group(1))
            check_flags(f"docker/{df}", os.path.basename(e[0]), e[1:] + json.loads(cmd.group(1)),
                        bins)
    # systemd: ExecStart of the templates (the ${VAR} and %d parts are values, not flags), and
    # the *_ARGS of the example environment file.
    for unit in UNITS:
        text = open(os.path.join(deploy, "systemd", unit + ".in")).read()
        for line in re.findall(r"^ExecStart=(.*)$", text, re.M):
            toks = line.split()
            check_flags(f"systemd/{unit}", os.path.basename(toks[0]), toks[1:], bins)
    env = open(os.path.join(deploy, "systemd", "ferry.env.example")).read()
    for var, prog in (("FERRY_BROKER_ARGS", "ferry-broker"), ("FERRY_WORKER_ARGS", "ferry-worker")):
        m = re.search(r'^%s="([^"]*)"' % var, env, re.M)
        if m:
            check_flags(f"systemd/ferry.env.example {var}", prog, m.group(1).split(), bins)
    for unit_text in [open(os.path.join(deploy, "systemd", u + ".in")).read() for u in UNITS]:
        for m in re.finditer(r"Environment=FERRY_(BROKER|WORKER)_CREDENTIAL_ARGS=(\S+)", unit_text):
            prog = "ferry-broker" if m.group(1) == "BROKER" else "ferry-worker"
            check_flags("systemd drop-in example", prog, [m.group(2)], bins)
