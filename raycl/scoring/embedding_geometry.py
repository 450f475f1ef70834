"""Alignment and uniformity of sentence embeddings (Wang & Isola, ICML 2020), as in the ZhichunRoad paper §5.

    ℓ_align   = E_{(x, y) ~ p_pos} ‖f(x) − f(y)‖^α          (α = 2)
    ℓ_uniform = log E_{x, y ~ p_data} exp(−t ‖f(x) − f(y)‖²)  (t = 2; over distinct pairs, as torch.pdist)

on L2-normalised embeddings; lower is better for both. The paper computes ℓ_align over STS pairs with gold
score ≥ 4 and ℓ_uniform over all STS-B + ASSIN2 sentences; its script averages per-batch values (batch 64,
uniformity over the batch's 128 sentences of both sides), which ``batch_size`` reproduces. Degenerate cases:
identical pair embeddings give ℓ_align = 0; all embeddings equal give ℓ_uniform = 0 (its maximum).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from raycl.files import atomic_file


def _batches(n: int, batch_size: int | None) -> list[slice]:
    step = n if batch_size is None else batch_size
    return [slice(i, i + step) for i in range(0, n, step)]


def alignment(
    x: torch.Tensor, y: torch.Tensor, *, alpha: float = 2.0, batch_size: int | None = None, normalize: bool = True
) -> torch.Tensor:
    """ℓ_align of positive pairs ``(x[i], y[i])``; x, y: (N, D). A scalar tensor.

    With ``batch_size`` the mean of per-batch means (the paper's script), else the plain mean.
    """
    if normalize:
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)  # (N, D)
    per_batch = [(x[s] - y[s]).norm(p=2, dim=1).pow(alpha).mean() for s in _batches(len(x), batch_size)]
    return torch.stack(per_batch).mean()


def uniformity(
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    t: float = 2.0,
    batch_size: int | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    """ℓ_uniform of the embeddings x (N, D), plus y (N, D) when given (both sides of pairs). A scalar.

    With ``batch_size`` the mean over batches of ℓ_uniform(x[b] ∪ y[b]) (the paper's script); a batch needs
    at least two embeddings.
    """
    if normalize:
        x = F.normalize(x, dim=-1)  # (N, D)
        y = None if y is None else F.normalize(y, dim=-1)
    values = []
    for s in _batches(len(x), batch_size):
        z = x[s] if y is None else torch.cat([x[s], y[s]])  # (b or 2b, D)
        values.append(torch.pdist(z, p=2).pow(2).mul(-t).exp().mean().log())  # over the b(b−1)/2 pairs
    return torch.stack(values).mean()


def plot_alignment_uniformity(
    points: Mapping[str, tuple[float, float]], path: str | Path, *, title: str = "alignment vs uniformity"
) -> Path:
    """A PNG like the paper's Fig. 5: one labelled point per model, ℓ_uniform on x, ℓ_align on y.

    ``points`` maps a label to ``(align, uniform)``; closer to the bottom-left is better. Written atomically.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 4), dpi=120)
    for label, (align, uniform) in points.items():
        ax.scatter([uniform], [align], s=40)
        ax.annotate(label, (uniform, align), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel(r"$\ell_{uniform}$")
    ax.set_ylabel(r"$\ell_{align}$")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return path
