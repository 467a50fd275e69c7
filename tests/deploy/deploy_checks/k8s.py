"""The Kubernetes manifests under deploy/kubernetes: each object has what it needs (names, pinned
images, matching selectors, a GPU or real MIG slice per worker, drain time, Redis with AOF on a
PVC and ACL users from a Secret, a readiness probe that authenticates, no password on a command
line or in a literal env value); across a rendered kustomization, the broker Service reaches the
broker's ports, CURVE keys and Redis passwords come from Secret volumes, the broker and the
workers connect to Redis as their ACL users, NetworkPolicies admit only workers to the backend,
producers to the frontend, the fleet (from its namespace) and producers to Redis, and the KEDA
ScaledObject scales a real Deployment on ferry_queue_depth. Each kustomization is rendered with
`kubectl kustomize` when kubectl is there; without it the raw base objects and the overlays' MIG
profiles are checked."""
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
# What each role's --redis URL names (deploy/redis/users.acl; make-keys.sh fills in the hashes).
REDIS_USERS = {"broker": "ferry-broker", "worker": "ferry-worker"}
# Passwords on a command line (`ps` shows it to everyone on the node, the pod spec to everyone who
# may read it): Redis's own flags, redis-cli's, a Ferry flag that does not exist, a URL with one.
PASSWORD_FLAGS = {"--requirepass", "--masterauth", "-a", "--pass", "--redis-password"}
URL_WITH_PASSWORD = re.compile(r"\b(rediss?|unix)://[^/@\s]*:[^/@\s]*@")
SECRET_ENV = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|(^|_)AUTH$")


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
        for c in containers + (pod.get("initContainers") or []):
            check_no_secret_in_spec(path, f"{kind}/{name}/{c.get('name')}", c)
        if name == "redis" and containers:
            args = " ".join(containers[0].get("args", []))
            if "--appendonly yes" not in args:
                problem(path, "redis: AOF (--appendonly yes) is off")
            if not spec.get("volumeClaimTemplates"):
                problem(path, "redis: no PersistentVolumeClaim for /data")
            check_redis_auth(path, containers[0], pod)
    if kind == "Service":
        ports = (doc.get("spec") or {}).get("ports") or []
        if not ports or any("port" not in p for p in ports):
            problem(path, f"Service/{name}: ports without port numbers")


def command_lines(container):
    """Every command line a container runs, as strings: command + args, and the probes' exec."""
    out = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        out += [str(a) for a in
                ((container.get(probe) or {}).get("exec") or {}).get("command") or []]
    return out


def check_no_secret_in_spec(path, what, container):
    """No password on a command line or as a literal env value: they come from mounted files."""
    for line in command_lines(container):
        for tok in line.split():
            if tok.split("=", 1)[0] in PASSWORD_FLAGS:
                problem(path, f"{what}: {tok.split('=', 1)[0]} puts a password on the command "
                        "line; read it from a mounted Secret file")
        if URL_WITH_PASSWORD.search(line):
            problem(path, f"{what}: a Redis URL with a password on the command line; name the "
                    "user only and give --redis-password-file")
        if re.search(r"REDISCLI_AUTH=(?!\"?\$)", line):
            problem(path, f"{what}: REDISCLI_AUTH set to a literal; read it from a mounted file")
    for e in container.get("env") or []:
        n = e.get("name", "")
        if "value" in e and SECRET_ENV.search(n) and not n.endswith("_FILE"):
            problem(path, f"{what}: env {n} holds a literal secret; mount it from a Secret")


def mounted_volume(path_value, container, pod):
    """The volume (its pod.volumes entry) a file path lies under, or None."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if path_value == mp or path_value.startswith(mp + "/"):
            return volumes.get(m["name"])
    return None


def check_redis_auth(path, container, pod):
    """Redis loads its ACL users from a Secret it can read (and no one else in the pod), takes no
    password on its command line, and its readiness probe authenticates and wants PONG."""
    args = [str(a) for a in container.get("args") or []]
    acl = flag_value(args, "--aclfile")
    if not acl:
        problem(path, "redis: no --aclfile: every client is Redis's default user, with no "
                "password (want the ACL users of deploy/redis/users.acl, from a Secret)")
    else:
        vol = mounted_volume(acl, container, pod)
        if not vol or "secret" not in vol:
            problem(path, f"redis: --aclfile {acl} is not on a Secret volume")
        else:
            mode = vol["secret"].get("defaultMode", 0o644)
            fs_group = (pod.get("securityContext") or {}).get("fsGroup")
            if mode & 0o004:
                problem(path, f"redis: the ACL Secret is readable by every user in the pod "
                        f"(defaultMode {mode:o})")
            elif not (mode & 0o040 and fs_group is not None):
                problem(path, f"redis: Redis cannot read the ACL Secret (defaultMode {mode:o}; "
                        "want group read and the pod's fsGroup)")
    probe = container.get("readinessProbe")
    if not probe:
        problem(path, "redis: no readinessProbe")
        return
    cmd = " ".join(str(a) for a in (probe.get("exec") or {}).get("command") or [])
    if "redis-cli" in cmd:
        if "REDISCLI_AUTH" not in cmd or "--user" not in cmd:
            problem(path, "redis: the readinessProbe's redis-cli does not authenticate (the "
                    "default user is off: Redis answers NOAUTH); give --user and REDISCLI_AUTH "
                    "from a mounted file")
        if "PONG" not in cmd:
            problem(path, "redis: the readinessProbe must look for PONG: redis-cli exits 0 on "
                    "an error reply (NOAUTH, LOADING)")
        for f in re.findall(r"\$\(cat\s+([^\s)\"]+)\)", cmd):
            if not secret_backed(f, container, pod):
                problem(path, f"redis: the readinessProbe's password file {f} is not on a "
                        "Secret volume")


def check_redis_client(path, who, user, container, pod):
    """A Ferry component's --redis names its ACL user, without the password, and
    --redis-password-file comes from a Secret volume."""
    args = [str(a) for a in container.get("args") or []]
    url = flag_value(args, "--redis")
    if not url:
        problem(path, f"{who} without --redis")
        return
    m = re.match(r"^(?:rediss?|unix)://(?:([^@/]*)@)?", url)
    userinfo = (m.group(1) if m else None) or ""
    if ":" in userinfo:
        problem(path, f"{who}: a password in --redis (a command line); give "
                "--redis-password-file")
    if not userinfo.split(":")[0]:
        problem(path, f"{who}: --redis {url} names no user: Redis's default user, which is "
                f"off (want redis://{user}@...)")
    elif userinfo.split(":")[0] != user:
        problem(path, f"{who}: --redis names user {userinfo.split(':')[0]}, want {user}")
    pw = flag_value(args, "--redis-password-file")
    if not pw:
        problem(path, f"{who} without --redis-password-file (the password of Redis user {user})")
    elif not secret_backed(pw, container, pod):
        problem(path, f"{who} --redis-password-file {pw} is not on a Secret volume")


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
    vol = mounted_volume(path_value, container, pod)
    return bool(vol and "secret" in vol)


def policy_admits(policies, pod_labels, port, from_labels, scope="any"):
    """Whether some NetworkPolicy selecting pods with `pod_labels` admits pods with
    `from_labels` on `port`. scope "namespace": only by a peer without a namespaceSelector (the
    policy's own namespace); "cluster": only by one with a namespaceSelector (other namespaces
    too, whichever their labels); "any": either."""
    for doc in policies:
        sel = (doc["spec"].get("podSelector") or {}).get("matchLabels") or {}
        if any(pod_labels.get(k) != v for k, v in sel.items()):
            continue
        for rule in doc["spec"].get("ingress") or []:
            ports = [p.get("port") for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            for peer in rule.get("from") or []:
                if scope != "any" and ("namespaceSelector" in peer) != (scope == "cluster"):
                    continue
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
    # Redis: each as its ACL user, the password from a Secret file.
    check_redis_client(dep[0], "broker", REDIS_USERS["broker"], bc, bpod)
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
        check_redis_client(path, name, REDIS_USERS["worker"], wc, wpod)

    # NetworkPolicies: only workers reach the backend, only producers the frontend, only the
    # fleet (from its own namespace) and producers (labelled, from any namespace) Redis.
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
            elif not policy_admits(policies, rlabels, 6379, lab, "namespace"):
                problem(where, f"the {who} reaches Redis only by a rule for every namespace: "
                        "admit the fleet from its own namespace (no namespaceSelector)")
            if policy_admits(policies, rlabels, 6379, lab, "cluster"):
                problem(where, f"a pod in any namespace with the {who}'s labels reaches Redis")
        if policy_admits(policies, rlabels, 6379, {}):
            problem(where, "any pod may reach Redis")
        producer = {"ferry.io/role": "producer", "ferry.io/redis-client": "true"}
        if not policy_admits(policies, rlabels, 6379, producer, "cluster"):
            problem(where, "producers in other namespaces (ferry.io/redis-client) may not reach "
                    "Redis for their results")

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
