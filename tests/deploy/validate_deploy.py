#!/usr/bin/env python3
"""Validates deploy/ without Docker or a cluster: every YAML/JSON file parses; the Kubernetes
objects (each kustomization rendered with `kubectl kustomize` when kubectl is there), the compose
file, the Prometheus config, the Grafana dashboard and the systemd units have what they need:
CURVE keys from Secrets/volumes/credentials, NetworkPolicies, pinned image tags, a real MIG
profile, the install prefix in the units; every flag a deploy file passes to a Ferry binary is
one that binary's --help lists; every package the CMake build requires is installed by each
Dockerfile (and by scripts/install-deps.sh), and the broker image's runtime stage has the
libraries the built broker links.

usage: validate_deploy.py DEPLOY_DIR NAMES_H [--repo DIR] [--broker BIN] [--worker BIN]
                          [--cli BIN] [--units DIR --bindir DIR] [--cmake CMAKE --build-dir DIR]
Exits 0 when everything holds, 1 with one line per problem otherwise. Checks whose tool or
binary is missing are skipped with a note.
"""
import argparse
import base64
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

PROBLEMS = []
NOTES = []


def problem(path, msg):
    PROBLEMS.append(f"{path}: {msg}")


def note(msg):
    NOTES.append(f"validate_deploy: {msg}")


def metric_names(names_h):
    """The metric names defined in metrics/include/ferry/metrics/names.h."""
    text = open(names_h).read()
    names = set(re.findall(r'= "((?:ferry|process)_[a-z0-9_]+)";', text))
    if len(names) < 20:
        problem(names_h, f"found only {len(names)} metric names")
    return names


def metrics_in_expr(expr):
    return set(re.findall(r"\b(ferry_[a-z0-9_]+)", expr))


def known_metric(name, names):
    if name in names:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in names:
            return True
    return False


WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
# NVIDIA's MIG profiles (MIG user guide): A100 40GB, A100 80GB / H100 80GB, H100 94GB, H200 141GB.
MIG_PROFILES = {
    "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
}
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-(\d+g\.\d+gb))$")


def pod_of(doc):
    return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}


def check_k8s(path, doc, objects):
    kind = doc.get("kind")
    meta = doc.get("metadata") or {}
    if not doc.get("apiVersion"):
        problem(path, f"{kind}: no apiVersion")
    if not meta.get("name"):
        problem(path, f"{kind}: no metadata.name")
    name = meta.get("name", "?")
    objects.append((path, doc))
    if kind in WORKLOADS:
        spec = doc.get("spec") or {}
        tmpl = spec.get("template") or {}
        pod = tmpl.get("spec") or {}
        containers = pod.get("containers") or []
        if not containers:
            problem(path, f"{kind}/{name}: no containers")
        for c in containers + (pod.get("initContainers") or []):
            if not c.get("name") or not c.get("image"):
                problem(path, f"{kind}/{name}: a container without name or image")
            image = c.get("image", "")
            if "ferry-" in image and (":" not in image or image.endswith(":latest")):
                problem(path, f"{kind}/{name}: image {image} has no pinned tag")
        if kind != "Job":
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            labels = (tmpl.get("metadata") or {}).get("labels") or {}
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                problem(path, f"{kind}/{name}: selector.matchLabels do not match the pod labels")
        if name.startswith("ferry-worker"):
            limits = {}
            for c in containers:
                limits.update(((c.get("resources") or {}).get("limits")) or {})
            gpus = [k for k in limits if GPU_RESOURCE.match(k)]
            if not gpus:
                problem(path, f"{kind}/{name}: worker requests no nvidia.com/gpu or MIG slice")
            for k in gpus:
                if int(limits[k]) < 1:
                    problem(path, f"{kind}/{name}: {k} limit < 1")
                profile = GPU_RESOURCE.match(k).group(2)
                if profile and profile not in MIG_PROFILES:
                    problem(path, f"{kind}/{name}: {k} is no A100/H100/H200 MIG profile")
            if pod.get("terminationGracePeriodSeconds", 30) < 60:
                problem(path, f"{kind}/{name}: give workers time to drain (grace >= 60 s)")
        if name == "redis":
            args = " ".join(containers[0].get("args", []) if containers else [])
            if "--appendonly yes" not in args:
                problem(path, "redis: AOF (--appendonly yes) is off")
            if not spec.get("volumeClaimTemplates"):
                problem(path, "redis: no PersistentVolumeClaim for /data")
    if kind == "Service":
        ports = (doc.get("spec") or {}).get("ports") or []
        if not ports or any("port" not in p for p in ports):
            problem(path, f"Service/{name}: ports without port numbers")


def container_ports(doc):
    out = {}
    for c in pod_of(doc)["containers"]:
        for p in c.get("ports") or []:
            out[p.get("name")] = p["containerPort"]
            out[p["containerPort"]] = p["containerPort"]
    return out


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def secret_backed(path_value, container, pod):
    """Whether a file path lies under a volumeMount whose volume is a Secret."""
    secrets = {v["name"] for v in pod.get("volumes") or [] if "secret" in v}
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if (path_value == mp or path_value.startswith(mp + "/")) and m["name"] in secrets:
            return True
    return False


def policy_admits(policies, pod_labels, port, from_labels):
    """Whether some NetworkPolicy selecting pods with `pod_labels` admits pods with
    `from_labels` on `port`."""
    for doc in policies:
        sel = (doc["spec"].get("podSelector") or {}).get("matchLabels") or {}
        if any(pod_labels.get(k) != v for k, v in sel.items()):
            continue
        for rule in doc["spec"].get("ingress") or []:
            ports = [p.get("port") for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            for peer in rule.get("from") or []:
                want = (peer.get("podSelector") or {}).get("matchLabels")
                if want is not None and all(from_labels.get(k) == v for k, v in want.items()):
                    return True
    return False


def policies_for(policies, pod_labels):
    return [d for d in policies
            if all(pod_labels.get(k) == v for k, v in
                   ((d["spec"].get("podSelector") or {}).get("matchLabels") or {}).items())]


def check_k8s_cross(where, objects, names):
    by_kind = {}
    for path, doc in objects:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = (path, doc)
    deployments = by_kind.get("Deployment", {})
    svc = by_kind.get("Service", {}).get("ferry-broker")
    dep = deployments.get("ferry-broker")
    worker = deployments.get("ferry-worker")
    if not svc or not dep or not worker:
        problem(where, "no ferry-broker Deployment and Service, or no ferry-worker Deployment")
        return
    ports = {p["port"]: p for p in svc[1]["spec"]["ports"]}
    cports = container_ports(dep[1])
    for want in (5555, 5556):
        if want not in ports:
            problem(svc[0], f"Service/ferry-broker lacks port {want}")
        elif cports.get(ports[want].get("targetPort", want)) != want:
            problem(svc[0], f"Service/ferry-broker port {want} targets no broker port {want}")
    selector = svc[1]["spec"].get("selector") or {}
    labels = pod_of(dep[1])and dep[1]["spec"]["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in selector.items()):
        problem(svc[0], "Service/ferry-broker selector does not select the broker pods")

    # CURVE: the broker's secret and allow dirs, the workers' keys, all from Secrets.
    bpod = pod_of(dep[1])
    bc = bpod["containers"][0]
    bargs = bc.get("args") or []
    for flag in ("--curve-secret", "--allow-producers", "--allow-workers"):
        v = flag_value(bargs, flag)
        if not v:
            problem(dep[0], f"broker without {flag}")
        elif not secret_backed(v, bc, bpod):
            problem(dep[0], f"broker {flag} {v} is not on a Secret volume")
    if flag_value(bargs, "--metrics-port") and flag_value(bargs, "--metrics-addr") != "0.0.0.0":
        problem(dep[0], "broker /metrics must bind 0.0.0.0 for Prometheus and the probes")
    for name, (path, doc) in deployments.items():
        if not name.startswith("ferry-worker"):
            continue
        wpod = pod_of(doc)
        wc = wpod["containers"][0]
        wargs = wc.get("args") or []
        for flag in ("--curve-server-public", "--curve-secret"):
            v = flag_value(wargs, flag)
            if not v:
                problem(path, f"{name} without {flag}")
            elif not secret_backed(v, wc, wpod):
                problem(path, f"{name} {flag} {v} is not on a Secret volume")
        if flag_value(wargs, "--metrics-port") and flag_value(wargs, "--metrics-addr") != "0.0.0.0":
            problem(path, f"{name}: /metrics must bind 0.0.0.0 for Prometheus and the probes")

    # NetworkPolicies: only workers reach the backend, only producers the frontend, only the
    # fleet Redis.
    policies = [d for _, d in by_kind.get("NetworkPolicy", {}).items() for d in [d[1]]]
    blabels = dep[1]["spec"]["template"]["metadata"]["labels"]
    wlabels = worker[1]["spec"]["template"]["metadata"]["labels"]
    redis = by_kind.get("StatefulSet", {}).get("redis")
    if not policies_for(policies, blabels):
        problem(where, "no NetworkPolicy selects the broker")
    else:
        if not policy_admits(policies, blabels, 5556, wlabels):
            problem(where, "the NetworkPolicy does not admit the workers to the backend (5556)")
        if policy_admits(policies, blabels, 5556, {"ferry.io/role": "producer"}):
            problem(where, "producers may reach the backend (5556)")
        if not policy_admits(policies, blabels, 5555, {"ferry.io/role": "producer"}):
            problem(where, "the NetworkPolicy does not admit producers to the frontend (5555)")
        if policy_admits(policies, blabels, 5555, wlabels):
            problem(where, "workers may reach the frontend (5555)")
    if not redis:
        problem(where, "no redis StatefulSet")
    else:
        rlabels = redis[1]["spec"]["template"]["metadata"]["labels"]
        if not policies_for(policies, rlabels):
            problem(where, "no NetworkPolicy selects Redis")
        for who, lab in (("broker", blabels), ("worker", wlabels)):
            if not policy_admits(policies, rlabels, 6379, lab):
                problem(where, f"the {who} may not reach Redis under the NetworkPolicy")
        if policy_admits(policies, rlabels, 6379, {}):
            problem(where, "any pod may reach Redis")

    for name, (path, doc) in by_kind.get("ScaledObject", {}).items():
        target = doc["spec"]["scaleTargetRef"]["name"]
        if target not in deployments:
            problem(path, f"ScaledObject/{name} scales unknown Deployment {target}")
        triggers = doc["spec"].get("triggers") or []
        if not triggers:
            problem(path, f"ScaledObject/{name}: no triggers")
        for t in triggers:
            q = (t.get("metadata") or {}).get("query", "")
            if t.get("type") != "prometheus" or "ferry_queue_depth" not in q:
                problem(path, f"ScaledObject/{name}: want a prometheus trigger on ferry_queue_depth")
            for m in metrics_in_expr(q):
                if not known_metric(m, names):
                    problem(path, f"ScaledObject/{name}: unknown metric {m}")
            if float((t.get("metadata") or {}).get("threshold", "0")) <= 0:
                problem(path, f"ScaledObject/{name}: threshold must be > 0")


def check_kustomization(path, doc):
    base = os.path.dirname(path)
    for r in doc.get("resources") or []:
        if not os.path.exists(os.path.join(base, r)):
            problem(path, f"resource {r} does not exist")
    for p in doc.get("patches") or []:
        if isinstance(p.get("patch"), str):
            try:
                yaml.safe_load(p["patch"])
            except yaml.YAMLError as e:
                problem(path, f"a patch does not parse: {e}")
    names = {i.get("name"): i for i in doc.get("images") or []}
    if os.path.basename(base) == "base":
        for want in ("ferry-broker", "ferry-worker"):
            img = names.get(want)
            if not img or not img.get("newTag") or str(img.get("newTag")) == "latest":
                problem(path, f"images: no pinned newTag for {want} (the override point)")


def render_kustomizations(kdir, names):
    """Every kustomization under kdir, rendered by kubectl and checked as a whole. Returns
    [(where, [(path, object)])]. Without kubectl: the raw base objects, and the MIG profiles
    the overlays' patches ask for."""
    kubectl = shutil.which("kubectl")
    dirs = sorted(os.path.dirname(p) for p in
                  glob.glob(os.path.join(kdir, "**", "kustomization.yaml"), recursive=True))
    rendered = []
    mig_seen = set()
    if not kubectl:
        note("kubectl not found; kustomizations not rendered (raw base objects checked)")
        objects = []
        for f in sorted(glob.glob(os.path.join(kdir, "base", "*.yaml"))):
            for d in yaml.safe_load_all(open(f)):
                if isinstance(d, dict) and d.get("kind") not in (None, "Kustomization"):
                    check_k8s(os.path.relpath(f, kdir), d, objects)
        check_k8s_cross("kubernetes/base", objects, names)
        rendered.append(("kubernetes/base", objects))
        for d in dirs:
            text = open(os.path.join(d, "kustomization.yaml")).read()
            for profile in re.findall(r"op: add\s+path: \S*/limits/nvidia\.com~1mig-(\S+)", text):
                mig_seen.add("nvidia.com/mig-" + profile)
                if profile not in MIG_PROFILES:
                    problem(os.path.relpath(d, kdir), f"mig-{profile} is no A100/H100/H200 MIG "
                            "profile")
    for d in dirs if kubectl else []:
        rel = "kubernetes/" + os.path.relpath(d, kdir)
        r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True)
        if r.returncode != 0:
            problem(rel, "kubectl kustomize failed: " + r.stderr.strip()[:400])
            continue
        objects = []
        for doc in yaml.safe_load_all(r.stdout):
            if isinstance(doc, dict):
                check_k8s(rel, doc, objects)
        check_k8s_cross(rel, objects, names)
        rendered.append((rel, objects))
        for _, doc in objects:
            if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "ferry-worker":
                limits = pod_of(doc)["containers"][0].get("resources", {}).get("limits", {})
                mig_seen.update(k for k in limits if k.startswith("nvidia.com/mig-"))
                if "mig" in os.path.basename(d) and not any(
                        k.startswith("nvidia.com/mig-") for k in limits):
                    problem(rel, "MIG variant without a nvidia.com/mig-* resource")
    if kubectl:
        note(f"kubectl kustomize rendered {len(dirs)} kustomizations")
    if len(mig_seen) < 2:
        problem("kubernetes", f"want the MIG profile as a choice (overlays), saw {sorted(mig_seen)}")
    return rendered


def check_compose(path, doc):
    services = doc.get("services") or {}
    for name, s in services.items():
        if not s.get("image") and not s.get("build"):
            problem(path, f"service {name}: no image or build")
        image = str(s.get("image", ""))
        if "ferry-" in image and (image.endswith(":latest") or ":" not in image):
            problem(path, f"service {name}: image {image} has no pinned tag")
    redis = services.get("redis")
    if not redis or "appendonly" not in " ".join(redis.get("command", [])):
        problem(path, "redis service without AOF")
    if redis and redis.get("ports"):
        problem(path, "redis is published: keep it on the compose network")
    workers = [n for n in services if n.startswith("worker")]
    if len(workers) != 1:
        problem(path, f"want one worker service (a worker per GPU inside it), got {workers}")
    for n in workers:
        w = services[n]
        devs = (((w.get("deploy") or {}).get("resources") or {}).get("reservations")
                or {}).get("devices") or []
        if not any("gpu" in (d.get("capabilities") or []) for d in devs):
            problem(path, f"service {n}: no GPU reservation")
        for d in devs:
            if "device_ids" in d or "FERRY_GPU_COUNT" not in str(d.get("count", "")):
                problem(path, f"service {n}: the GPU count must come from FERRY_GPU_COUNT")
        deps = w.get("depends_on") or {}
        for need in ("keygen", "models"):
            if (deps.get(need) or {}).get("condition") != "service_completed_successfully":
                problem(path, f"service {n}: must wait for {need} to complete")
        args = w.get("command") or []
        for flag in ("--curve-server-public", "--curve-secret"):
            if flag not in args:
                problem(path, f"service {n}: no {flag}")
    models = services.get("models") or {}
    if "ferry-make-models" not in json.dumps(models.get("command", "")):
        problem(path, "no models service running ferry-make-models")
    keygen = services.get("keygen") or {}
    if "ferry keygen" not in json.dumps(keygen.get("command", "")):
        problem(path, "no keygen service running ferry keygen")
    broker = services.get("broker")
    if not broker:
        problem(path, "no broker service")
    else:
        args = broker.get("command") or []
        for flag in ("--curve-secret", "--allow-producers", "--allow-workers"):
            if flag not in args:
                problem(path, f"broker: no {flag}")
        if ((broker.get("depends_on") or {}).get("keygen") or {}).get(
                "condition") != "service_completed_successfully":
            problem(path, "broker: must wait for keygen to complete")


def check_prometheus(path, doc):
    jobs = [c.get("job_name") for c in doc.get("scrape_configs") or []]
    if not jobs or not all(jobs):
        problem(path, "scrape_configs without job_name")


def check_dashboard(path, doc, names):
    panels = doc.get("panels") or []
    if not panels:
        problem(path, "no panels")
    used = set()
    for p in panels:
        for t in p.get("targets") or []:
            expr = t.get("expr", "")
            if not expr:
                problem(path, f"panel {p.get('title')}: empty expr")
            for m in metrics_in_expr(expr):
                used.add(m)
                if not known_metric(m, names):
                    problem(path, f"panel {p.get('title')}: unknown metric {m}")
    for must in ("ferry_queue_depth", "ferry_job_latency_seconds_bucket",
                 "ferry_jobs_finished_total", "ferry_batch_size_sum"):
        if must not in used:
            problem(path, f"dashboard does not show {must}")


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


# ---- flags: every flag a deploy file passes exists in that binary's --help -------------------

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


# ---- make-keys.sh: the Secrets hold what the manifests mount, each secret only where needed ----

def z85_field(cert_text, field):
    m = re.search(field + r' = "(.{40})"', cert_text)
    return m.group(1) if m else None


def check_make_keys(deploy, cli, rendered):
    kubectl = shutil.which("kubectl")
    if not (kubectl and cli):
        note("no kubectl or --cli: kubernetes/make-keys.sh not run")
        return
    script = os.path.join(deploy, "kubernetes", "make-keys.sh")
    r = subprocess.run(["bash", script, "--print", "--producer", "app1"], capture_output=True,
                       text=True, env=dict(os.environ, FERRY=cli))
    if r.returncode != 0:
        problem("kubernetes/make-keys.sh", f"rc {r.returncode}: {r.stderr.strip()[:400]}")
        return
    secrets = {}
    for d in yaml.safe_load_all(r.stdout):
        if isinstance(d, dict) and d.get("kind") == "Secret":
            secrets[d["metadata"]["name"]] = {k: base64.b64decode(v).decode()
                                              for k, v in (d.get("data") or {}).items()}
    want = {"ferry-broker-keys": {"broker.key_secret"},
            "ferry-allow-producers": {"producer.key", "app1.key"},
            "ferry-allow-workers": {"worker.key"},
            "ferry-worker-keys": {"worker.key_secret", "broker.key"},
            "ferry-producer-keys": {"producer.key_secret", "broker.key"},
            "ferry-producer-app1": {"app1.key_secret", "broker.key"}}
    for name, files in want.items():
        if set(secrets.get(name, {})) != files:
            problem("kubernetes/make-keys.sh", f"Secret {name} holds {sorted(secrets.get(name, {}))}"
                    f", want {sorted(files)}")
            return
    for name, files in secrets.items():
        for f, text in files.items():
            if f.endswith(".key") and "secret-key" in text:
                problem("kubernetes/make-keys.sh", f"{name}/{f} (a public key) holds a secret")
    broker_public = z85_field(secrets["ferry-broker-keys"]["broker.key_secret"], "public-key")
    for name in ("ferry-worker-keys", "ferry-producer-keys"):
        if z85_field(secrets[name]["broker.key"], "public-key") != broker_public:
            problem("kubernetes/make-keys.sh", f"{name}/broker.key is not the broker's public key")
    pairs = (("ferry-allow-workers", "worker.key", "ferry-worker-keys", "worker.key_secret"),
             ("ferry-allow-producers", "producer.key", "ferry-producer-keys",
              "producer.key_secret"))
    for allow, pub, owner, sec in pairs:
        if z85_field(secrets[allow][pub], "public-key") != z85_field(secrets[owner][sec],
                                                                    "public-key"):
            problem("kubernetes/make-keys.sh", f"{allow}/{pub} does not match {owner}/{sec}")
    # Every key file a manifest's flag names is in the Secret mounted there.
    for rel, objects in rendered:
        for _, doc in objects:
            if doc.get("kind") not in WORKLOADS:
                continue
            pod = pod_of(doc)
            vols = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes") or []
                    if "secret" in v}
            for c in pod.get("containers", []):
                args = c.get("args") or []
                for flag in ("--curve-secret", "--curve-server-public"):
                    path = flag_value(args, flag)
                    for m in c.get("volumeMounts") or []:
                        if path and m["name"] in vols and os.path.dirname(path) == m["mountPath"]:
                            secret = vols[m["name"]]
                            if os.path.basename(path) not in secrets.get(secret, {}):
                                problem(rel, f"{doc['metadata']['name']}: {flag} {path}: Secret "
                                        f"{secret} from make-keys.sh has no such key")
                for flag in ("--allow-producers", "--allow-workers"):
                    path = flag_value(args, flag)
                    for m in c.get("volumeMounts") or []:
                        if path and m["mountPath"] == path and vols.get(m["name"]) not in secrets:
                            problem(rel, f"{flag} {path}: make-keys.sh makes no Secret "
                                    f"{vols.get(m['name'])}")


# ---- the launcher: one worker per device, its own name and metrics port ----------------------

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


# ---- Dockerfiles against the CMake build's requirements --------------------------------------

# What each CMake requirement is called as a Debian/Ubuntu package.
CMAKE_TO_PACKAGE = {
    "pkg:libzmq": "libzmq3-dev", "pkg:hiredis": "libhiredis-dev",
    "pkg:cpp-httplib": "libcpp-httplib-dev", "pkg:tomlplusplus": "libtomlplusplus-dev",
    "find:OpenSSL": "libssl-dev", "find:spdlog": "libspdlog-dev",
    "find:PkgConfig": "pkg-config", "find:Threads": None,
    "path:zmq.hpp": "cppzmq-dev", "path:msgpack.hpp": "libmsgpack-cxx-dev",
    "path:toml++/toml.h": "libtomlplusplus-dev",
}
TOOLS = ["cmake", "ninja-build", "pkg-config"]


def cmake_requirements(cmakelists):
    text = open(cmakelists).read()
    reqs = set()
    for m in re.finditer(r"pkg_check_modules\(\s*\w+\s+REQUIRED[^)]*?(\S+)\)", text):
        reqs.add("pkg:" + m.group(1))
    for m in re.finditer(r"find_package\(\s*(\w+)\s+REQUIRED", text):
        reqs.add("find:" + m.group(1))
    for m in re.finditer(r"find_path\(\s*\w+\s+(\S+)\s+REQUIRED\)", text):
        reqs.add("path:" + m.group(1))
    # A fallback chain ends in one REQUIRED: its optional first tries need no package of their own.
    return reqs


def build_stage(text):
    stages = re.split(r"^FROM ", text, flags=re.M)
    return stages[1] if len(stages) > 1 else text


def check_dockerfile_packages(deploy, repo):
    if not repo:
        note("no --repo: Dockerfile packages not checked against CMake")
        return
    parts = {"broker": ["CMakeLists.txt", "core", "protocol", "runtime", "metrics", "broker",
                        "producer-sdk", "deploy"],
             "worker": None}  # None: everything but tests
    files = [f for f in glob.glob(os.path.join(repo, "**", "CMakeLists.txt"), recursive=True)
             if not re.search(r"/(tests|build[^/]*|clients|examples)/",
                              os.path.relpath(f, repo).join("//"))]
    install_deps = open(os.path.join(repo, "scripts", "install-deps.sh")).read()
    for image, only in parts.items():
        reqs = set()
        for f in files:
            rel = os.path.relpath(f, repo)
            top = rel.split(os.sep)[0]
            if only is None or top in only:
                reqs |= cmake_requirements(f)
        text = open(os.path.join(deploy, "docker", f"Dockerfile.{image}")).read()
        build = build_stage(text)
        # The worker image names its packages once, in an ARG both stages use.
        arg = re.search(r'ARG FERRY_DEPS="([^"]*)"', text.replace("\\\n", " "))
        if arg:
            build += " " + arg.group(1)
        want = set(TOOLS)
        for r in sorted(reqs):
            if r not in CMAKE_TO_PACKAGE:
                problem("tests/deploy/validate_deploy.py",
                        f"CMake requires {r}: add its package to CMAKE_TO_PACKAGE")
            elif CMAKE_TO_PACKAGE[r]:
                want.add(CMAKE_TO_PACKAGE[r])
        for pkg in sorted(want):
            if not re.search(r"(^|\s)" + re.escape(pkg) + r"(\s|$)", build):
                problem(f"docker/Dockerfile.{image}", f"the build stage does not install {pkg} "
                        "(the CMake build requires it)")
            if not re.search(r"(^|\s)" + re.escape(pkg) + r"(\s|$)", install_deps):
                problem("scripts/install-deps.sh", f"does not install {pkg}")


def check_broker_runtime_libs(deploy, broker_bin):
    """The broker image runs on the same Debian as this host: each library the built broker
    links directly must come from a package its runtime stage installs (or the base image)."""
    readelf, dpkg = shutil.which("readelf"), shutil.which("dpkg")
    if not (broker_bin and readelf and dpkg):
        note("no --broker, readelf or dpkg: the broker image's runtime libraries not checked")
        return
    r = subprocess.run([readelf, "-d", broker_bin], capture_output=True, text=True)
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", r.stdout)
    text = open(os.path.join(deploy, "docker", "Dockerfile.broker")).read()
    runtime = re.split(r"^FROM ", text, flags=re.M)[-1]
    base = {"libc6", "libstdc++6", "libgcc-s1"}
    for lib in needed:
        q = subprocess.run([dpkg, "-S", "*/" + lib], capture_output=True, text=True)
        pkgs = {l.split(":")[0] for l in q.stdout.splitlines() if l.strip()}
        if not pkgs:
            continue  # not from a package (e.g. a build-tree library)
        if pkgs & base:
            continue
        if not any(re.search(r"(^|\s)" + re.escape(p) + r"(\s|$)", runtime) for p in pkgs):
            problem("docker/Dockerfile.broker",
                    f"the runtime stage lacks {' or '.join(sorted(pkgs))} (ferry-broker needs {lib})")


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("deploy")
    ap.add_argument("names_h")
    ap.add_argument("--repo")
    ap.add_argument("--broker")
    ap.add_argument("--worker")
    ap.add_argument("--cli")
    ap.add_argument("--units")
    ap.add_argument("--bindir", default="")
    ap.add_argument("--cmake")
    ap.add_argument("--build-dir")
    a = ap.parse_args()
    deploy, names_h = a.deploy, a.names_h
    bins = {k: v for k, v in (("ferry-broker", a.broker), ("ferry-worker", a.worker),
                              ("ferry", a.cli)) if v and os.path.exists(v)}
    names = metric_names(names_h)
    files = 0
    for root, _, fs in os.walk(deploy):
        for f in sorted(fs):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, deploy)
            if f.endswith((".yaml", ".yml")):
                files += 1
                try:
                    docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
                except yaml.YAMLError as e:
                    problem(rel, f"YAML does not parse: {e}")
                    continue
                for d in docs:
                    if not isinstance(d, dict):
                        problem(rel, "a document that is not a mapping")
                    elif d.get("kind") == "Kustomization":
                        check_kustomization(path, d)
                    elif "apiVersion" in d or "kind" in d:
                        pass  # Kubernetes objects: checked as rendered kustomizations
                    elif f == "docker-compose.yml":
                        check_compose(rel, d)
                    elif "scrape_configs" in d:
                        check_prometheus(rel, d)
                    elif rel.startswith("redis" + os.sep):
                        pass
                    else:
                        problem(rel, "unrecognised YAML document")
                # Time-slicing/MPS configs are YAML inside a ConfigMap: parse those too.
                for d in docs:
                    if isinstance(d, dict) and d.get("kind") == "ConfigMap":
                        for k, v in (d.get("data") or {}).items():
                            try:
                                inner = yaml.safe_load(v)
                                if not (inner.get("sharing") or {}):
                                    problem(rel, f"ConfigMap key {k}: no sharing section")
                            except yaml.YAMLError as e:
                                problem(rel, f"ConfigMap key {k}: {e}")
            elif f.endswith(".json"):
                files += 1
                try:
                    doc = json.load(open(path))
                except json.JSONDecodeError as e:
                    problem(rel, f"JSON does not parse: {e}")
                    continue
                if "panels" in doc:
                    check_dashboard(rel, doc, names)
    rendered = render_kustomizations(os.path.join(deploy, "kubernetes"), names)
    check_systemd(deploy, a.units, a.bindir)
    check_install(a.cmake, a.build_dir)
    check_all_flags(deploy, bins, rendered, a.units)
    check_launcher(deploy)
    check_make_keys(deploy, bins.get("ferry"), rendered)
    check_dockerfile_packages(deploy, a.repo)
    check_broker_runtime_libs(deploy, bins.get("ferry-broker"))
    for d in ("docker/Dockerfile.broker", "docker/Dockerfile.worker"):
        text = open(os.path.join(deploy, d)).read()
        if "FROM" not in text or "ENTRYPOINT" not in text:
            problem(d, "no FROM or ENTRYPOINT")
    if "bookworm-slim" not in open(os.path.join(deploy, "docker/Dockerfile.broker")).read():
        problem("docker/Dockerfile.broker", "runtime stage is not debian:bookworm-slim")
    print("\n".join(NOTES))
    if PROBLEMS:
        print("\n".join(PROBLEMS))
        return 1
    print(f"validate_deploy: {files} YAML/JSON files, flags of {sorted(bins)} checked: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
