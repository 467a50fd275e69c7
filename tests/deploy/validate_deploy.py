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
import json
import os
import sys

import yaml

# The checks live in deploy_checks/ next to this file (see its __init__.py for which module checks
# what); this file parses the arguments, parses every file, and runs the checks in order. Keep the
# source tree free of __pycache__ (the script is run by path from the build tree).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_checks import docker, flags, hosts, k8s, make_keys, monitoring, report  # noqa: E402


def check_files(deploy, names):
    """Every YAML/JSON file under deploy/ parses; each document goes to the check for what it
    is (Kubernetes objects are checked later, as rendered kustomizations). Returns how many
    files there were."""
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
                    report.problem(rel, f"YAML does not parse: {e}")
                    continue
                for d in docs:
                    if not isinstance(d, dict):
                        report.problem(rel, "a document that is not a mapping")
                    elif d.get("kind") == "Kustomization":
                        k8s.check_kustomization(path, d)
                    elif "apiVersion" in d or "kind" in d:
                        pass  # Kubernetes objects: checked as rendered kustomizations
                    elif f == "docker-compose.yml":
                        docker.check_compose(rel, d)
                    elif "scrape_configs" in d:
                        monitoring.check_prometheus(rel, d)
                    elif rel.startswith("redis" + os.sep):
                        pass
                    else:
                        report.problem(rel, "unrecognised YAML document")
                # Time-slicing/MPS configs are YAML inside a ConfigMap: parse those too.
                for d in docs:
                    if isinstance(d, dict) and d.get("kind") == "ConfigMap":
                        for k, v in (d.get("data") or {}).items():
                            try:
                                inner = yaml.safe_load(v)
                                if not (inner.get("sharing") or {}):
                                    report.problem(rel, f"ConfigMap key {k}: no sharing section")
                            except yaml.YAMLError as e:
                                report.problem(rel, f"ConfigMap key {k}: {e}")
            elif f.endswith(".json"):
                files += 1
                try:
                    doc = json.load(open(path))
                except json.JSONDecodeError as e:
                    report.problem(rel, f"JSON does not parse: {e}")
                    continue
                if "panels" in doc:
                    monitoring.check_dashboard(rel, doc, names)
    return files


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
    names = monitoring.metric_names(names_h)
    files = check_files(deploy, names)
    rendered = k8s.render_kustomizations(os.path.join(deploy, "kubernetes"), names)
    hosts.check_systemd(deploy, a.units, a.bindir)
    hosts.check_install(a.cmake, a.build_dir)
    flags.check_all_flags(deploy, bins, rendered, a.units)
    hosts.check_launcher(deploy)
    make_keys.check_make_keys(deploy, bins.get("ferry"), rendered)
    docker.check_dockerfile_packages(deploy, a.repo)
    docker.check_broker_runtime_libs(deploy, bins.get("ferry-broker"))
    docker.check_dockerfile_basics(deploy)
    print("\n".join(report.NOTES))
    if report.PROBLEMS:
        print("\n".join(report.PROBLEMS))
        return 1
    print(f"validate_deploy: {files} YAML/JSON files, flags of {sorted(bins)} checked: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
