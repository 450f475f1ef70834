"""FGM: one step of size ε along the normalised gradient of the whole word-embedding matrix.

E_adv = E + ε·g/‖g‖_F, g = ∂L/∂E (global Frobenius norm);  ∇θ ← ∇θL + ∇θL(E_adv).

References:
    Miyato, Dai, Goodfellow. "Adversarial Training Methods for Semi-Supervised Text Classification."
    ICLR 2017, Eq. 5 (r_adv = −ε·g/‖g‖₂); Goodfellow et al., ICLR 2015 (FGSM). The released
    ``subtaskA/utils.py`` ``FGM`` class (docs/recipes/idiom.md).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from raycl.adversarial.base import AdversarialMethod, Forward, ascend


class FGM(AdversarialMethod):
    """Fast Gradient Method on the embedding matrix, as the ZhichunRoad code runs it.

    After the caller's clean backward, E ← E + ε·g/‖g‖_F (skipped when g = 0), one adversarial
    forward/backward *accumulates* into ``.grad``, and E is restored. Gradient = ∇L + ∇L_adv.
    ``alpha`` and ``steps`` are unused.

    Inputs: ``forward() -> (loss (), logits (B, C))``. Degenerate cases: ε = 0 switches it off (``.grad``
    untouched); it equals one-step PGD with α = ε, and FreeLB / SMART(μ = 0) with K = 1 and α = ε.
    """

    name = "fgm"

    def _attack(
        self, forward: Forward, origin: Tensor, *, clean_logits: Tensor | None, loss_scale: float
    ) -> dict[str, Any]:
        ascend(self.weight, self.epsilon)
        loss_adv, _ = forward()
        (loss_adv * loss_scale).backward()  # accumulates onto the clean gradient
        return {"adv/loss": loss_adv.detach()}
