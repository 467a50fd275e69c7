"""kubernetes/make-keys.sh: run with --print, its Secrets hold what the manifests mount, each
secret only where it is needed (public keys hold no secret; the broker's public key and the
allow lists match the key pairs), and every key file a rendered manifest's flag names is in the
Secret mounted there."""
import base64
import os
import re
import shutil
import subprocess

import yaml

from .k8s import WORKLOADS, flag_value, pod_of
from .report import note, problem


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
