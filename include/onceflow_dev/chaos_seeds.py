"""`make chaos-seeds`: the chaos run once per seed (CHAOS_SEEDS, default "1 2 3 4 4711"), on one node or on the
cluster (CHAOS_TOPOLOGY=cluster), each with every knob of `make chaos`; a verdict that holds for one seed only
proves nothing about liveness. Each seed's report is kept (`var/chaos-seeds/<topology>-<seed>/report.json`) and
one table of all of them is printed and written (`var/chaos-seeds/<topology>.md`): faults injected, lost,
duplicated, the liveness figures per fault kind (median and worst seconds to the next commit and to the lag
back at its level) and the longest time between two commits. Exit 1 if any seed fails.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from onceflow import config
from onceflow_dev import chaos, chaos_cluster, chaos_plan, interrupt


def table(topology: str, reports: list[dict[str, Any]]) -> str:
    """A Markdown table of the runs, one row per seed and fault kind."""
    lines = [
        f"`make chaos-seeds` ({topology}): one row per seed and fault kind; seconds from each fault to the next "
        "committed batch and to the lag back at its level before the fault (median / worst); the longest time "
        "between two commits",
        "",
        "| seed | result | records | lost | dup | not injected | longest gap s | fault | n | next commit s | lag back s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        kinds = r["liveness"]["by_kind"] or {"-": {}}
        for i, (kind, k) in enumerate(kinds.items()):
            head = (
                f"| {r['seed']} | {'PASS' if r['ok'] else 'FAIL'} | {r['records']:,} | {r['lost']} | "
                f"{r['duplicated']} | {len(r['missed'])} | {(r['liveness'].get('commit_gap') or {}).get('longest_s')} |"
                if i == 0
                else "| | | | | | | |"
            )
            lines.append(
                f"{head} {kind} | {k.get('n', 0)} | {k.get('to_commit_median_s')} / {k.get('to_commit_worst_s')} | "
                f"{k.get('to_lag_median_s')} / {k.get('to_lag_worst_s')} |"
            )
    failed = [f"- seed {r['seed']} failed: {chaos_plan.reasons(r)}" for r in reports if not r["ok"]]
    return "\n".join(lines + ([""] + failed if failed else [])) + "\n"


def main() -> int:
    cluster = os.environ.get("CHAOS_TOPOLOGY") == "cluster"
    topology = "cluster" if cluster else "one-node"
    seeds = [int(x) for x in os.environ.get("CHAOS_SEEDS", "1 2 3 4 4711").split()]
    chaos.prepare_var()  # logging, and an empty var/chaos for the runs' own files
    root = config.REPO_ROOT / "var" / "chaos-seeds"
    root.mkdir(parents=True, exist_ok=True)
    reports = []
    for seed in seeds:
        var = root / f"{topology}-{seed}"
        shutil.rmtree(var, ignore_errors=True)
        if cluster:
            report = chaos_cluster.run(chaos_cluster.ClusterChaosSpec(seed=seed), var)
        else:
            report = chaos.run(chaos.ChaosSpec(seed=seed), var)
        (var / "report.json").write_text(json.dumps(report, indent=1))
        reports.append(report)
        print(f"seed {seed}: {chaos_plan.verdict(report)} ({var / 'report.json'})", flush=True)
    out = table(topology, reports)
    (root / f"{topology}.md").write_text(out)
    print(out)
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    interrupt.run(main)
