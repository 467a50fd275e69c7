"""The Kubernetes manifests under deploy/kubernetes: each object has what it needs (names, pinned
images, matching selectors, a GPU or real MIG slice per worker, drain time, Redis with AOF on a
PVC); across a rendered kustomization, the broker Service reaches the broker's ports, CURVE keys
come from Secret volumes, NetworkPolicies admit only workers to the backend, producers to the
frontend and the fleet to Redis, and the KEDA ScaledObject scales a real Deployment on
ferry_queue_depth. Each kustomization is rendered with `kubectl kustomize` when kubectl is there;
without it the raw base objects and the overlays' MIG profiles are checked."""
import glob
import os
import re
import shutil
import subprocess

import yaml

from .monitoring import known_metric, metrics_in_expr
from .report import note, problem


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
