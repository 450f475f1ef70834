"""One shared local Ray per test session (started lazily, by the tests that need it); never `ray stop`. Under
pytest-xdist a session is a worker: each worker has its own Ray, its own temporary folders."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Ray Train V2 starts a PreemptionWatcher actor (a process of its own, polling for node drains) for every worker
# group: one process more per training, paid in imports, for a cloud node's preemption no test makes. Every Ray of
# the session inherits the setting (the local one, the embedded ones of the CLIs a test starts).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def pytest_ignore_collect(collection_path, config) -> bool | None:  # noqa: ANN001
    """``-m gpu`` (``make test-gpu``, or ``python3 -m pytest -m gpu`` on a GPU machine without the venv): only the
    files that hold GPU tests are imported, so that the others' dependencies (spaCy, ERRANT) need not be there."""
    if config.getoption("markexpr", "") == "gpu" and collection_path.suffix == ".py":
        return "pytest.mark.gpu" not in collection_path.read_text(encoding="utf-8")
    return None


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker (``make test`` runs two, ``-n 2``) computes with one torch thread: two workers on two
    cores, each with a pool of two threads, spend their time waiting on each other's cores (a model trained in a
    fixture took 20 s alone and 460 s beside a loaded neighbour)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order, the rest as collected: ``make test`` deals whole
    files to two pytest-xdist workers in this order (``--dist loadfile --no-loadscope-reorder``), so a long file
    starts early instead of keeping one worker busy alone at the end."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the rest keep their order


# file -> [worker, first start, last stop, seconds of setup + call + teardown]; on the pytest-xdist controller it
# gathers every worker's reports (``make test``'s per-file figures, to order LONGEST_FIRST by)
_FILES: dict[str, list[Any]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # the WorkerController a report came from (pytest-xdist's controller)
    worker = node.gateway.id if node is not None else os.environ.get("PYTEST_XDIST_WORKER", "main")
    entry = _FILES.setdefault(report.nodeid.split("::")[0], [worker, report.start, report.stop, 0.0])
    entry[1], entry[2] = min(entry[1], report.start), max(entry[2], report.stop)
    entry[3] += report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each worker's files in the order they ran (seconds each, ≥ 5 s), the time it ended, and the longest files:
    the figures to order :data:`LONGEST_FIRST` by, so that the two workers end together."""
    if not _FILES or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    t0 = min(e[1] for e in _FILES.values())
    write = terminalreporter.write_line
    terminalreporter.section("seconds per test file")
    for worker in sorted({e[0] for e in _FILES.values()}):
        files = sorted((e[1], name, e[3], e[2]) for name, e in _FILES.items() if e[0] == worker)
        busy, end = sum(f[2] for f in files), max(f[3] for f in files) - t0
        shown = ", ".join(f"{Path(name).name} {s:.0f}" for _, name, s, _ in files if s >= 5)
        write(f"{worker}: {len(files)} files, {busy:.0f} s of tests, done at {end:.0f} s: {shown}")
    longest = sorted(_FILES.items(), key=lambda kv: -kv[1][3])[:24]
    write("longest: " + ", ".join(f"{Path(name).name} {e[3]:.0f}" for name, e in longest))


@pytest.fixture(scope="session")
def ray_local():
    """A 2-CPU local Ray shared by every test that asks for it; shut down once at the end of the session."""
    import ray

    from raycl.distributed.runtime import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


# The test files that take longest on 2 cores (``make test``'s "seconds per test file"), longest first. A file
# missing here only runs later; one that grew slow belongs here. pytest-xdist hands a worker its next file as soon
# as two or fewer of its tests are left, so the file after a one- or two-test file is queued behind it on the same
# worker: the third file here waits for the first (the killed sweep's) — a long file there would not run beside it.
# Seconds of the last measured run; the order is the one that ended both workers together then (1,206 and 1,220 s).
LONGEST_FIRST = (
    "test_resume_driver.py",  # 248 s (make test here, 2026-11-28: 1,249 s in all; CI's 2-core machine takes ~1.2x)
    "test_gec_recipe.py",  # 116
    "test_equivalence.py",  # 263
    "test_tracking.py",  # 130
    "test_sts_recipe.py",  # 152
    "test_dense_mining.py",  # 171
    "test_progress_lines.py",  # 52
    "test_resume_train_driver.py",  # 86
    "test_trainer_restart.py",  # 69
    "test_chaos_bench.py",  # 81
    "test_resources.py",  # 49
    "test_storage.py",  # 65
    "test_security.py",  # 68
    "test_shared_nbest.py",  # 35
    "test_dense_refresh.py",  # 41
    "test_coherence_recipe.py",  # 54
    "test_ct2_engine.py",  # 67
    "test_gpu_node_problems.py",  # 45
    "test_resume.py",  # 23
    "test_stream.py",  # 76
)


# The GEC recipe at its smallest: a 1+1-layer BART of width 32 and a few dozen built-in sentences.
GEC_TINY = [
    "data.builtin.n_train=120",
    "data.builtin.n_finetune=40",
    "data.builtin.n_dev=16",
    "data.builtin.n_test=16",
    "model.overrides={d_model: 32, encoder_layers: 1, decoder_layers: 1, encoder_ffn_dim: 64, "
    "decoder_ffn_dim: 64}",
    "model.vocab_size=300",
    "pretrain.epochs=1",
    "optim.epochs=1",
    "optim.batch_size=16",
    "eval.max_new_tokens=24",
    "mining.max_len_b=24",
    "mining.beam=4",
    "mining.k=2",
    "mining.cpus_per_miner=0.25",
    "mining.task_size=8",
    "mining.queue_size=32",
]


def ending(model_dir: Path, *, bias: float = 4.0) -> Path:
    """An untrained model folder made to end its hypotheses within a few tokens (a bias on ``</s>``): a miner keeps
    no hypothesis cut at the length bound, and a random model's never end."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir))
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] += bias
    model.save_pretrained(str(model_dir))
    return model_dir


S3_BUCKET = "raycl-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free port, one bucket, and the environment every raycl process reads it from."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "RAYCL_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
    try:
        yield env
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        from raycl import storage

        storage.forget_filesystems()
        server.stop()
