"""The metric names that names.h defines, and the Prometheus config and Grafana dashboard that
use them: scrape jobs have names, every panel's expression names known metrics, and the
dashboard shows the queue, latency, throughput and batch size."""
import re

from .report import problem


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
