"""``bench/chaos.py`` as a test: real beam-search miners on three logical nodes; three miner kills and a node
removed during a two-epoch run lose and duplicate nothing. Runs as a child process (it builds its own cluster,
while the test session has its own local Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "chaos.py"


def test_chaos_run_delivers_every_item_exactly_once() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--per-rank", "96", "--miners", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nchaos: {result}")
    assert result["miner_kills"] >= 3 and result["node_kills"] == 1
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["completed"] is True
    assert [e["delivered"] for e in result["per_epoch"]] == [192, 192]
    assert result["stream"]["reassigned"] >= 1  # the killed miners' tasks really came back
    assert len(result["model_versions_seen"]) > 1  # miners pulled published weights during the run
