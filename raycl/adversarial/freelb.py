"""FreeLB: K projected ascent steps whose adversarial gradients are averaged ("free" large batch).

δ₀ = 0;  δ_{t+1} = Π_{‖δ‖_F≤ε}(δ_t + α·ĝ_t/‖ĝ_t‖_F), ĝ₀ = ∂L/∂E, ĝ_t = (1/K)Σ_{s<t}∂L(E+δ_{s+1})/∂E;
∇θ ← ∇θL + (1/K)Σ_{t=1..K}∇θL(E + δ_t).

References:
    Zhu et al. "FreeLB: Enhanced Adversarial Training for Natural Language Understanding." ICLR 2020,
    Algorithm 1 — with the code's gradient-based first step instead of the paper's random init of δ₀,
    and the clean gradient added back, as the released ``subtaskA/utils.py`` does (docs/recipes/idiom.md).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from raycl.adversarial.base import AdversarialMethod, Forward, backup_grads, restore_grads, zero_grads


class FreeLB(AdversarialMethod):
    """FreeLB on the embedding matrix, as the ZhichunRoad code runs it (best one-shot method).

    1. Back up the clean gradients. 2. For t < K: step as in PGD (t = 0 along the clean gradient); zero the
    gradients after the t = 0 step; backward L_adv/K, accumulating (so steps t ≥ 1 follow the accumulated
    adversarial gradient). 3. Add the clean gradient back. Gradient = ∇L + (1/K)Σ_t∇L_adv,t. E is restored.

    Inputs: ``forward() -> (loss (), logits (B, C))``. Degenerate cases: ε = 0 switches it off; K = 1 with
    α ≤ ε is FGM with step α; α = 0 averages K passes at the clean E (∇L + ∇L for a deterministic model).
    """

    name = "freelb"

    def _attack(
        self, forward: Forward, origin: Tensor, *, clean_logits: Tensor | None, loss_scale: float
    ) -> dict[str, Any]:
        clean = backup_grads(self.model)
        total: Any = 0.0
        for t in range(self.steps):
            self.ascend_and_project(origin)
            if t == 0:
                zero_grads(self.model)  # the clean gradient steers only the first step
            loss_adv, _ = forward()
            (loss_adv * (loss_scale / self.steps)).backward()  # the average over the K steps
            total = total + loss_adv.detach()  # summed on the device: no wait for each pass
        restore_grads(self.model, clean, add=True)
        return {"adv/loss": total / self.steps}
