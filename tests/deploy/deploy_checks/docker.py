"""Docker: the compose file (pinned images, Redis with AOF and unpublished, one worker service
taking its GPU count from FERRY_GPU_COUNT, the keygen and models steps first, CURVE flags), the
Dockerfiles (a FROM and an ENTRYPOINT; each build stage, and scripts/install-deps.sh, installs
every package the CMake build requires) and the broker image's runtime stage (the libraries the
built broker links, on debian:bookworm-slim)."""
import glob
import json
import os
import re
import shutil
import subprocess

from .report import note, problem


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
                problem("tests/deploy/deploy_checks/docker.py",
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


def check_dockerfile_basics(deploy):
    for d in ("docker/Dockerfile.broker", "docker/Dockerfile.worker"):
        text = open(os.path.join(deploy, d)).read()
        if "FROM" not in text or "ENTRYPOINT" not in text:
            problem(d, "no FROM or ENTRYPOINT")
    if "bookworm-slim" not in open(os.path.join(deploy, "docker/Dockerfile.broker")).read():
        problem("docker/Dockerfile.broker", "runtime stage is not debian:bookworm-slim")
