#!/usr/bin/env python3
"""Validates deploy/: every YAML/JSON file parses; the Kubernetes objects, the compose file, the
Prometheus config, the Grafana dashboard and the systemd units have what they need.

usage: validate_deploy.py DEPLOY_DIR NAMES_H
Exits 0 when everything holds, 1 with one line per problem otherwise.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

PROBLEMS = []


def problem(path, msg):
    PROBLEMS.append(f"{path}: {msg}")


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
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-\d+g\.\d+gb)$")


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
            if "mig" in name and not any(k.startswith("nvidia.com/mig-") for k in gpus):
                problem(path, f"{kind}/{name}: MIG variant without a nvidia.com/mig-* resource")
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
    for c in doc["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports") or []:
            out[p.get("name")] = p["containerPort"]
            out[p["containerPort"]] = p["containerPort"]
    return out


def check_k8s_cross(objects, names):
    by_kind = {}
    for path, doc in objects:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = (path, doc)
    deployments = by_kind.get("Deployment", {})
    # The broker Service: 5555 and 5556, pointing at ports the broker container has.
    svc = by_kind.get("Service", {}).get("ferry-broker")
    dep = deployments.get("ferry-broker")
    if not svc or not dep:
        problem("kubernetes", "no ferry-broker Deployment and Service")
    else:
        ports = {p["port"]: p for p in svc[1]["spec"]["ports"]}
        cports = container_ports(dep[1])
        for want in (5555, 5556):
            if want not in ports:
                problem(svc[0], f"Service/ferry-broker lacks port {want}")
            elif cports.get(ports[want].get("targetPort", want)) != want:
                problem(svc[0], f"Service/ferry-broker port {want} targets no broker port {want}")
        selector = svc[1]["spec"].get("selector") or {}
        labels = dep[1]["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in selector.items()):
            problem(svc[0], "Service/ferry-broker selector does not select the broker pods")
    for variant in ("ferry-worker", "ferry-worker-mig", "ferry-worker-shared"):
        if variant not in deployments:
            problem("kubernetes", f"no Deployment {variant}")
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
    if "StatefulSet" not in by_kind or "redis" not in by_kind["StatefulSet"]:
        problem("kubernetes", "no redis StatefulSet")


def check_kustomization(path, doc):
    for r in doc.get("resources") or []:
        if not os.path.exists(os.path.join(os.path.dirname(path), r)):
            problem(path, f"resource {r} does not exist")


def check_compose(path, doc):
    services = doc.get("services") or {}
    for name, s in services.items():
        if not s.get("image") and not s.get("build"):
            problem(path, f"service {name}: no image or build")
    redis = services.get("redis")
    if not redis or "appendonly" not in " ".join(redis.get("command", [])):
        problem(path, "redis service without AOF")
    workers = [n for n in services if n.startswith("worker")]
    if not workers:
        problem(path, "no worker services")
    for n in workers:
        devs = (((services[n].get("deploy") or {}).get("resources") or {}).get("reservations")
                or {}).get("devices") or []
        if not any("gpu" in (d.get("capabilities") or []) for d in devs):
            problem(path, f"service {n}: no GPU reservation")
    if "broker" not in services:
        problem(path, "no broker service")


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


def check_systemd(deploy):
    units = [os.path.join(deploy, "systemd", f) for f in ("ferry-broker.service",
                                                           "ferry-worker@.service")]
    for u in units:
        text = open(u).read()
        for need in ("[Unit]", "[Service]", "[Install]", "ExecStart=", "KillSignal=SIGTERM"):
            if need not in text:
                problem(u, f"no {need}")
        for line in text.splitlines():
            s = line.strip()
            if s and not s.startswith(("#", ";", "[")) and "=" not in s:
                problem(u, f"not Key=Value: {s}")
    tool = shutil.which("systemd-analyze")
    if not tool:
        print("validate_deploy: systemd-analyze not found; checked unit syntax only")
        return
    # Verify copies whose ExecStart binaries are replaced by /bin/true (the real ones exist only
    # after `cmake --install`), and the template as instance 0.
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for u in units:
            text = re.sub(r"/usr/local/bin/ferry-[a-z-]+", "/bin/true", open(u).read())
            name = os.path.basename(u).replace("@.service", "@0.service")
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
                print(f"validate_deploy: systemd-analyze cannot run here ({out.splitlines()[0]}); "
                      "checked unit syntax only")
            else:
                problem("systemd", "systemd-analyze verify: " + (out or f"rc {r.returncode}"))
        else:
            print("validate_deploy: systemd-analyze verify passed")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    deploy, names_h = sys.argv[1], sys.argv[2]
    names = metric_names(names_h)
    objects = []
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
                        check_k8s(rel, d, objects)
                    elif f == "docker-compose.yml":
                        check_compose(rel, d)
                    elif "scrape_configs" in d:
                        check_prometheus(rel, d)
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
    check_k8s_cross(objects, names)
    check_systemd(deploy)
    for d in ("docker/Dockerfile.broker", "docker/Dockerfile.worker"):
        text = open(os.path.join(deploy, d)).read()
        if "FROM" not in text or "ENTRYPOINT" not in text:
            problem(d, "no FROM or ENTRYPOINT")
    if "bookworm-slim" not in open(os.path.join(deploy, "docker/Dockerfile.broker")).read():
        problem("docker/Dockerfile.broker", "runtime stage is not debian:bookworm-slim")
    if PROBLEMS:
        print("\n".join(PROBLEMS))
        return 1
    print(f"validate_deploy: {files} YAML/JSON files, {len(objects)} Kubernetes objects: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
