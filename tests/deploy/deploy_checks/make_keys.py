"""kubernetes/make-keys.sh: run with --print, its Secrets hold what the manifests mount, each
secret only where it is needed (public keys hold no secret; the broker's public key and the
allow lists match the key pairs; each role's Redis password is in its own Secret, and the ACL
file for Redis holds the SHA-256 of each and the rules of deploy/redis/users.acl, never a
password), and every key or password file a rendered manifest names (--curve-*,
--redis-password-file, --aclfile, the probe's file) is in the Secret mounted there. Without
kubectl or the `ferry` binary, only this: every Secret a manifest mounts is one make-keys.sh
names."""
import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import yaml

from .k8s import WORKLOADS, command_lines, flag_value, pod_of
from .report import note, problem

WHERE = "kubernetes/make-keys.sh"
# The Redis user whose password each Secret holds (redis.password).
PASSWORD_OWNERS = {"ferry-broker-keys": "ferry-broker", "ferry-worker-keys": "ferry-worker",
                   "ferry-producer-keys": "ferry-producer", "ferry-producer-app1": "ferry-producer"}
# What the readiness probe's user may do: PING, nothing else.
PROBE_RULES = {"on", "resetchannels", "resetkeys", "-@all", "+ping"}


def z85_field(cert_text, field):
    m = re.search(field + r' = "(.{40})"', cert_text)
    return m.group(1) if m else None


def acl_users(text):
    """{user: (rules without the passwords, [password hashes])} of an ACL file."""
    users = {}
    for line in text.splitlines():
        toks = line.split()
        if len(toks) >= 2 and toks[0] == "user":
            users[toks[1]] = ([t for t in toks[2:] if not t.startswith("#")],
                              [t[1:] for t in toks[2:] if t.startswith("#")])
    return users


def mounted_secrets(rendered):
    """{Secret name: where it is mounted} over the rendered workloads."""
    out = {}
    for rel, objects in rendered:
        for _, doc in objects:
            if doc.get("kind") in WORKLOADS:
                for v in pod_of(doc).get("volumes") or []:
                    if "secret" in v:
                        out.setdefault(v["secret"]["secretName"],
                                       f"{rel} {doc['metadata']['name']}")
    return out


def check_acl(deploy, secrets):
    """The ACL file in ferry-redis-auth against the template and the passwords."""
    acl = secrets["ferry-redis-auth"]["users.acl"]
    users = acl_users(acl)
    template = acl_users(open(os.path.join(deploy, "redis", "users.acl")).read())
    default = users.get("default", ([], []))[0]
    if "off" not in default or "on" in default or "nopass" in default:
        problem(WHERE, "users.acl: the default user is not off")
    for user, (rules, hashes) in users.items():
        if any(r.startswith(">") or r == "nopass" for r in rules):
            problem(WHERE, f"users.acl: user {user} has a plain password or nopass (want #sha256)")
        if any(not re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            problem(WHERE, f"users.acl: user {user}: a password hash that is not 64 hex digits")
    for user, (rules, _) in template.items():
        if user not in users:
            problem(WHERE, f"users.acl has no user {user} (deploy/redis/users.acl has)")
        elif users[user][0] != rules:
            problem(WHERE, f"users.acl: the rules of {user} differ from deploy/redis/users.acl")
    passwords = []
    for name, user in PASSWORD_OWNERS.items():
        pw = secrets.get(name, {}).get("redis.password", "")
        passwords.append(pw)
        if hashlib.sha256(pw.encode()).hexdigest() not in users.get(user, ([], []))[1]:
            problem(WHERE, f"{name}/redis.password is no password of user {user} in users.acl")
    for user, (rules, _) in users.items():
        if user not in template:
            if set(rules) - PROBE_RULES:
                problem(WHERE, f"users.acl: user {user} (not in deploy/redis/users.acl) may do "
                        f"more than PING: {' '.join(sorted(set(rules) - PROBE_RULES))}")
    probe = secrets["ferry-redis-auth"].get("probe.password", "")
    if probe:
        passwords.append(probe)
        if not any(hashlib.sha256(probe.encode()).hexdigest() in h
                   for u, (_, h) in users.items() if u not in template):
            problem(WHERE, "ferry-redis-auth/probe.password is no password of a probe user")
    if len(set(passwords)) != len(passwords):
        problem(WHERE, "two Secrets hold the same Redis password")
    for pw in passwords:
        if len(pw) < 32 or re.search(r"\s", pw):
            problem(WHERE, "a Redis password shorter than 32 characters, or with white space")
        elif pw in acl:
            problem(WHERE, "users.acl holds a password, not only its hash")


def check_make_keys(deploy, cli, rendered):
    # Without running it: every Secret the manifests mount is one that make-keys.sh makes.
    text = open(os.path.join(deploy, "kubernetes", "make-keys.sh")).read()
    for secret, where in sorted(mounted_secrets(rendered).items()):
        if secret not in text:
            problem(where, f"mounts Secret {secret}, which make-keys.sh does not make")
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
    # A custom --acl template that lets the default user in, or defines the probe user the
    # script adds (Redis then refuses the whole file), is refused before anything is made.
    with tempfile.TemporaryDirectory() as tmp:
        template = open(os.path.join(deploy, "redis", "users.acl")).read()
        for bad, why in ((template.replace("user default off", "user default on nopass ~* +@all"),
                          "user default off"),
                         (template + "user ferry-probe on nopass +ping\n", "defines ferry-probe")):
            path = os.path.join(tmp, "bad.acl")
            with open(path, "w") as f:
                f.write(bad)
            b = subprocess.run(["bash", script, "--print", "--acl", path], capture_output=True,
                               text=True, env=dict(os.environ, FERRY=cli))
            if b.returncode != 2 or why not in b.stderr:
                problem("kubernetes/make-keys.sh", f"--acl with a template that {why!r} was "
                        f"not refused: rc {b.returncode}: {b.stderr.strip()[:200]}")
    secrets = {}
    for d in yaml.safe_load_all(r.stdout):
        if isinstance(d, dict) and d.get("kind") == "Secret":
            secrets[d["metadata"]["name"]] = {k: base64.b64decode(v).decode()
                                              for k, v in (d.get("data") or {}).items()}
    want = {"ferry-broker-keys": {"broker.key_secret", "redis.password"},
            "ferry-allow-producers": {"producer.key", "app1.key"},
            "ferry-allow-workers": {"worker.key"},
            "ferry-worker-keys": {"worker.key_secret", "broker.key", "redis.password"},
            "ferry-producer-keys": {"producer.key_secret", "broker.key", "redis.password"},
            "ferry-producer-app1": {"app1.key_secret", "broker.key", "redis.password"},
            "ferry-redis-auth": {"users.acl", "probe.password"}}
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
    check_acl(deploy, secrets)
    # Every key or password file a manifest's flag (or the Redis probe) names is in the Secret
    # mounted there.
    for rel, objects in rendered:
        for _, doc in objects:
            if doc.get("kind") not in WORKLOADS:
                continue
            pod = pod_of(doc)
            vols = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes") or []
                    if "secret" in v}
            for c in pod.get("containers", []):
                args = c.get("args") or []
                files = [(flag, flag_value(args, flag)) for flag in
                         ("--curve-secret", "--curve-server-public", "--redis-password-file",
                          "--aclfile")]
                for line in command_lines(c):
                    files += [("$(cat)", f) for f in re.findall(r"\$\(cat\s+([^\s)\"]+)\)", line)]
                for flag, path in files:
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
