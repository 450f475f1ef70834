"""The recipes' queues, step by step, against naive recomputations written here (issue 23): what the loss sees,
what is enqueued, in which order, what is evicted, and when the momentum encoder moves relative to the loss.

- STS with MoCo (``StsTask.step``): the queue the loss sees is the ring *before* this step (its keys enqueued
  after the loss, so a positive never sits among the negatives); θ_k moves once per step, *before* its keys are
  computed (moco's builder); keys are written at the pointer and wrap around the ring (K = 5, B = 3).
- Coherence with the momentum encoder (``coherence_loss`` + ``CoherenceTask.before_update``): the item's negatives
  are enqueued *before* the momentum loss (the released code's order); the FIFO drops the oldest ``num_negs`` per
  item once it holds ``size``; the momentum encoder moves after the backward, before the optimizer step.

Dropout is off in both models, so the two SimCSE views are equal and every recomputation is deterministic.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_equivalence import _no_dropout

from raycl.config.tasks.coherence import CoherenceConfig
from raycl.config.tasks.sts import StsConfig
from raycl.memory.negative_queue import NegativeQueue
from raycl.models.coherence import CoherenceScorer, MomentumEncoder, prefix_slice
from raycl.models.coherence_presets import build_coherence_model
from raycl.models.cross_attention import mean_pool
from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder
from raycl.recipes.coherence.step import coherence_loss, collate
from raycl.recipes.coherence.worker import CoherenceTask
from raycl.recipes.sts.worker import StsState, StsTask
from raycl.training.precision import Precision
from raycl.training.task import Job, StepContext, Worker

SENTENCES = [
    "the cat sat on the mat",
    "a dog barked all night",
    "rain fell on the town",
    "she read the old letter",
    "the market opened late",
    "he fixed the red bike",
    "birds sang at dawn",
    "the river rose quickly",
    "they planted three trees",
]


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _far_from(module: torch.nn.Module) -> None:
    """Move every weight of a momentum / key encoder by a fixed ±0.5 ramp: far from the live encoder from the first
    step, so keys taken from the wrong encoder change every rep (not only by chance of how far a step moved)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.linspace(-0.5, 0.5, p.numel()).view_as(p))


# ---------------------------------------------------------------------------------------------- STS: MoCo ring
def _sts(tmp: Path) -> tuple[StsTask, StsState, Any]:
    folder = build_sentence_encoder("smoke", tmp / "enc", texts=SENTENCES * 4, seed=3)
    _no_dropout(folder)
    cfg = StsConfig()
    cfg = replace(cfg, loss=replace(cfg.loss, lam=0.5), moco=replace(cfg.moco, queue_size=5, m=0.5))
    task = StsTask(cfg)
    model = SentenceEncoder.from_pretrained(folder)
    st = StsState(model, [], [], {})
    w = Worker(0, 1, torch.device("cpu"), Precision("fp32", torch.device("cpu")), tmp, Job(None, "", ""))
    task._key_encoder(st, w)
    return task, st, w


def test_sts_moco_step_against_a_naive_ring(tmp_path: Path) -> None:
    task, st, _ = _sts(tmp_path)
    moco, model, tau, m = st.moco, st.model, task.cfg.loss.temperature, task.cfg.moco.m
    assert moco is not None
    _far_from(moco.encoder_k)
    ring = [row.tolist() for row in moco.queue.t()]  # (K, H) the initial random keys
    ptr, key_params = 0, {n: p.detach().clone() for n, p in moco.encoder_k.named_parameters()}
    for step, batch in enumerate([SENTENCES[0:3], SENTENCES[3:6], SENTENCES[6:9]]):
        ids, mask = model.tokenize(batch)
        with torch.no_grad():
            h = model.embed(ids, mask).tolist()  # (B, H): both SimCSE views, dropout off
            # θ_k ← m θ_k + (1 − m) θ_q, then this step's keys from the moved encoder
            key_params = {
                n: m * p + (1 - m) * dict(model.named_parameters())[n].detach() for n, p in key_params.items()
            }
            f_k = copy.deepcopy(moco.encoder_k)
            f_k.load_state_dict({**f_k.state_dict(), **key_params})
            keys = mean_pool(f_k(ids, mask), mask).tolist()  # (B, H)
        # ℓ_i = −log e^{cos(h_i, h_i)/τ} / (Σ_j e^{cos(h_i, h_j)/τ} + Σ_q e^{cos(h_i, k_q)/τ}), the ring as it was
        losses = []
        for i in range(len(batch)):
            den = sum(math.exp(_cos(h[i], h[j]) / tau) for j in range(len(batch)))
            den += sum(math.exp(_cos(h[i], k) / tau) for k in ring)
            losses.append(-math.log(math.exp(_cos(h[i], h[i]) / tau) / den))
        out = task.step(st, task.collate(st, ("con", [], batch)), StepContext(model, torch.device("cpu"), None))
        assert float(out["l_con"]) == pytest.approx(sum(losses) / len(losses), rel=1e-4), f"step {step}"
        for t, k in enumerate(keys):  # then the keys go in at the pointer, wrapping around the ring
            ring[(ptr + t) % len(ring)] = k
        ptr = (ptr + len(batch)) % len(ring)
        assert int(moco.queue_ptr[0]) == ptr
        assert torch.allclose(moco.queue.t(), torch.tensor(ring), atol=1e-5), f"step {step}: the ring"
        for n, p in moco.encoder_k.named_parameters():
            assert torch.allclose(p, key_params[n], atol=1e-6), f"step {step}: θ_k.{n}"
        model.zero_grad()
    assert ptr == 9 % 5  # the third step wrapped around


# ---------------------------------------------------------------------------------------------- coherence: FIFO
DOCS = [tuple(f"{w} {i} ." for i, w in enumerate(s.split())) for s in SENTENCES]  # documents of 4–5 sentences


def test_coherence_momentum_step_against_a_naive_fifo(tmp_path: Path) -> None:
    folder = build_coherence_model("smoke", tmp_path / "coh", texts=[" ".join(d) for d in DOCS] * 4)
    _no_dropout(folder)
    scorer = CoherenceScorer.from_pretrained(folder)
    momentum, queue = (
        MomentumEncoder(scorer),
        NegativeQueue(int(scorer.encoder.config.hidden_size), size=4, num_negs=2),
    )
    _far_from(momentum.encoder)
    cfg = CoherenceConfig()
    cfg = replace(cfg, momentum=replace(cfg.momentum, m=0.5))  # a move large enough to see
    task = CoherenceTask(cfg, "")
    lam, margin, m = 0.85, 0.1, cfg.momentum.m
    fifo: list[list[float]] = []
    opt = torch.optim.SGD(scorer.parameters(), lr=0.5)
    for step in range(3):  # the queue holds 4: the second item fills it, the third evicts the first's negatives
        pos = [DOCS[step]]
        negs = [[tuple(reversed(DOCS[step])), DOCS[step][1:] + DOCS[step][:1]]]
        seed = 100 + step
        with torch.no_grad():
            k_neg = momentum(**scorer.encode(negs[0])).tolist()  # (2, H), the encoder before this step's move
            k_pos = momentum(**scorer.encode([prefix_slice(pos[0], random.Random(seed))])).tolist()[0]
            scores, reps = scorer(**scorer.encode([pos[0], *negs[0]]))
            q = reps[0].tolist()
        if len(fifo) >= 4:  # naive FIFO: full → drop the oldest num_negs, then append this item's negatives
            fifo = fifo[2:]
        fifo += k_neg  # before the loss: the queue the loss sees holds this item's negatives
        f_pos, f_negs = float(scores[0]), [float(s) for s in scores[1:]]
        l_c = -math.log(math.exp(f_pos) / (math.exp(f_pos) + sum(math.exp(f - margin) for f in f_negs)))
        pos_term = math.exp(_cos(q, k_pos))
        l_m = -math.log(pos_term / (pos_term + sum(math.exp(_cos(q, k) - margin) for k in fifo)))
        batch = collate(scorer, pos, negs, momentum=True, rng=random.Random(seed))
        out = coherence_loss(
            scorer, batch, kind="momentum", margin=margin, lam=lam, momentum=momentum, queue=queue
        )
        assert float(out.l_c) == pytest.approx(l_c, rel=1e-4), f"step {step}"
        assert float(out.l_m) == pytest.approx(l_m, rel=1e-4), f"step {step}"
        assert float(out.loss) == pytest.approx(lam * l_c + (1 - lam) * l_m, rel=1e-4)
        assert torch.allclose(queue.entries(), torch.tensor(fifo), atol=1e-5), f"step {step}: the FIFO"
        out.loss.backward()
        # after the backward, before the step: the momentum encoder moves toward the pre-step weights
        expected = {
            n: m * p.detach() + (1 - m) * dict(scorer.encoder.named_parameters())[n].detach()
            for n, p in momentum.encoder.named_parameters()
        }
        task.before_update(SimpleNamespace(momentum=momentum, model=scorer))  # type: ignore[arg-type]
        for n, p in momentum.encoder.named_parameters():
            assert torch.allclose(p, expected[n], atol=1e-7), f"step {step}: momentum.{n}"
        opt.step()
        opt.zero_grad()
    assert len(queue) == 4
