"""The checks that tests/deploy/validate_deploy.py runs on deploy/, one module per part of it:

report      the problems and notes every check records (printed by validate_deploy.main)
monitoring  metric names from names.h; the Prometheus config and the Grafana dashboard
k8s         Kubernetes objects, their cross-checks (CURVE keys, Redis ACL users and password
            files, NetworkPolicies, KEDA), the kustomizations (rendered by kubectl when it is there)
make_keys   kubernetes/make-keys.sh: its Secrets hold what the rendered manifests mount, its ACL
            file the hashes of its Redis passwords
hosts       the systemd units (templates, configured, `systemd-analyze verify`), the install
            step, the ferry-launch-gpus.sh launcher
docker      docker-compose.yml; the Dockerfiles against CMake's requirements and the broker's
            runtime libraries
flags       every flag a deploy file passes to a Ferry binary is in that binary's --help
"""
