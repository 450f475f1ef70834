"""The momentum (EMA) update of the coherence model's momentum encoder (Jwalapuram et al. 2022, Eq. 4).

θ_m ← m·θ_m + (1 − m)·θ, for every parameter (a few multi-tensor ops, not a loop); buffers are copied.
Recipe default m = 0.9999999, which moves θ_m by only ≈0.5% of the way to θ in 50k steps (the
momentum encoder is nearly frozen).

Call it **after ``loss.backward()`` and before ``optimizer.step()``**, as the released code does: the EMA then
averages in the weights the gradient was computed at (the pre-step weights), not the updated ones.
"""

from __future__ import annotations

import torch
from torch import nn

from raycl.memory.multi_tensor import copy_, momentum_


@torch.no_grad()
def momentum_update(target: nn.Module, source: nn.Module, *, m: float = 0.9999999) -> None:
    """θ_target ← m·θ_target + (1 − m)·θ_source in place; buffers of ``target`` become copies of ``source``'s.

    m = 0 makes ``target`` a copy of ``source``; m = 1 leaves it unchanged. Both modules must have the same
    parameter and buffer names and shapes (``target`` is a deep copy of ``source``).
    """
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"momentum m must be in [0, 1], got {m}")
    src_params, src_buffers = dict(source.named_parameters()), dict(source.named_buffers())
    tgt_params, tgt_buffers = dict(target.named_parameters()), dict(target.named_buffers())
    if src_params.keys() != tgt_params.keys() or src_buffers.keys() != tgt_buffers.keys():
        raise ValueError("momentum_update: target and source have different parameters or buffers")
    names = list(tgt_params)
    momentum_([tgt_params[n] for n in names], [src_params[n] for n in names], m)  # no_grad: read as they are
    copy_(list(tgt_buffers.values()), [src_buffers[n] for n in tgt_buffers])
