"""The config sections every task shares: ``scaling``, ``tune``, the loop's options in ``optim`` and the miner
pool's ``mining`` (each task's own sections extend them in ``raycl/config/tasks/<task>.py``), and :class:`Space`, a
resolved tune space."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScalingSection:
    num_workers: int = 1  # Ray Train workers per trial; 0 = local mode (in-process, a sweep's in its trials)
    use_gpu: bool = False
    # with use_gpu: GPUs per worker; a fraction shares a GPU (with miners, other trials), each process capped to
    # its share of the memory; two workers of one run never share one (NCCL refuses it): > 0.5 with 2 or more
    gpus_per_worker: float = 1.0
    cpus_per_worker: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per worker, e.g. {trainer: 1}
    max_failures: int = 2  # worker-group restarts from the last checkpoint (Ray Train FailureConfig); -1 = forever
    collective_timeout_s: int = 1800  # a collective that waits longer ends the run with an error (TorchConfig)
    # a worker group that cannot start (its resources taken, an autoscaler that does not deliver) ends the run
    # after this long, in Ray Train's attempts of RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s); 0 = wait for ever
    start_timeout_s: float = 600.0


@dataclass
class TuneSection:
    num_samples: int = 1
    max_concurrent_trials: int = 2
    scheduler: str = "fifo"  # fifo | asha
    metric: str = "dev_f05"
    mode: str = "max"
    driver_cpus: float = 0.25  # Tune trial driver bundle; {"CPU": 0} is rejected by Tune
    grace_period: int = 1  # ASHA: epochs before a trial may be stopped


PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class LoopOptions:
    """What the one training loop (``raycl/training/loop.py``) takes from every recipe's ``optim`` section."""

    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast (fp16 with a gradient scaler), training and evaluation
    update_freq: int = 1  # batches whose gradients are summed into one update (fairseq's --update-freq)
    tf32: bool = True  # TF32 matmuls for what stays fp32, on GPUs that have them (Ampere and newer)
    prefetch: int = 2  # batches read, sized and collated ahead in a background thread (0: in the step's thread)
    compile: bool = False  # torch.compile the model's forward (lengths bucketed so that shapes repeat)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune (inductor's modes)
    compile_backend: str = "inductor"  # torch.compile's backend; aot_eager traces without generating code


@dataclass
class OptimSection(LoopOptions):
    lr: float = 3e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-8
    weight_decay: float = 0.0
    scheduler: str = "fixed"  # fixed | polynomial
    warmup_updates: int = 0
    total_updates: int = 0  # polynomial decay horizon; 0 = epochs × steps per epoch
    clip_norm: float = 1.0
    batch_size: int = 32  # sentences per batch; with max_tokens, the pool (sorted by length) cut into batches
    max_tokens: int = 0  # fairseq's --max-tokens: sentences × longest num_tokens ≤ this a batch (0: by sentences)
    epochs: int = 3
    seed: int = 1


@dataclass
class MiningSection:
    """The miner pool and the negative stream (every mining recipe); recipes add their miner's own keys."""

    batch_size: int = 64  # examples per miner forward (a beam-search call, a scoring batch)
    negatives: str | None = None  # pre-mined Parquet: train on it instead of mining
    num_miners: int = 1
    cpus_per_miner: float = 1.0
    gpus_per_miner: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per miner, e.g. {miner: 1}
    sync_every: int = 0  # steps between weight publications; 0 = never (GEC: base-model negatives)
    max_staleness: int = 0
    refresh_every: int = 0  # epochs between re-mining with newer weights; 0 = never (the paper)
    queue_size: int = 256  # examples mined-and-undelivered plus being mined, at most (miners wait beyond it)
    task_size: int = 32  # examples per miner task
    lease_s: float = 60.0  # a task not returned within this many seconds is mined again by another miner
    precision: str = "fp32"  # the miners' forward passes: fp32 | bf16 | fp16 (autocast); int8 with ctranslate2

    def miner_options(self) -> dict[str, Any]:
        """The keyword arguments of this section's miner (``MinerFactory.options``): the one place they are read
        from the config. Every miner takes these; a task's section adds its miner's own."""
        return {"batch_size": self.batch_size, "precision": self.precision}


@dataclass
class Space:
    """A resolved tune space: the config at its default point, the search block and the baselines."""

    name: str
    source: str  # the YAML file it came from, for messages
    config: Any
    search: dict[str, dict[str, list[Any]]]
    baselines: dict[str, dict[str, Any]]
    preset: str | None = None
