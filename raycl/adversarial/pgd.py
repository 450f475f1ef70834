"""PGD: K projected ascent steps on the word-embedding matrix; only the last adversarial gradient is kept.

δ₀ = 0;  δ_{t+1} = Π_{‖δ‖_F≤ε}(δ_t + α·g_t/‖g_t‖_F), g₀ = ∂L/∂E, g_t = ∂L(E+δ_t)/∂E;
∇θ ← ∇θL + ∇θL(E + δ_K).

References:
    Madry et al. "Towards Deep Learning Models Resistant to Adversarial Attacks." ICLR 2018, Eq. 2
    (the projected steps; here with the ℓ2 step normalised by the global norm, as the
    released ``subtaskA/utils.py`` ``PGD`` class).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from raycl.adversarial.base import AdversarialMethod, Forward, backup_grads, restore_grads, zero_grads


class PGD(AdversarialMethod):
    """Projected gradient descent on the embedding matrix, as the ZhichunRoad code runs it.

    1. Back up the clean gradients. 2. For t < K: step α·g/‖g‖_F (t = 0 uses the clean gradient), project
    the total δ onto ‖δ‖_F ≤ ε. 3. Zero the gradients if t < K−1, else restore the clean ones; run the
    adversarial forward/backward. Gradient = ∇L + ∇L_adv(last). E is restored.

    Inputs: ``forward() -> (loss (), logits (B, C))``. Degenerate cases: ε = 0 switches it off; K = 1 with
    α = ε is FGM; α = 0 runs the adversarial pass at the clean E (gradient ∇L + ∇L, for a deterministic model).
    """

    name = "pgd"

    def _attack(
        self, forward: Forward, origin: Tensor, *, clean_logits: Tensor | None, loss_scale: float
    ) -> dict[str, Any]:
        clean = backup_grads(self.model)
        last: Any = None
        for t in range(self.steps):
            self.ascend_and_project(origin)
            if t < self.steps - 1:
                zero_grads(self.model)  # the intermediate gradients only steer the attack
            else:
                restore_grads(self.model, clean)
            loss_adv, _ = forward()
            (loss_adv * loss_scale).backward()
            last = loss_adv.detach()
        return {"adv/loss": last}
