"""The code's "SMART": FreeLB-style steps that keep the clean gradient, plus μ·KL(perturbed ‖ clean).

δ_{t+1} = Π_{‖δ‖_F≤ε}(δ_t + α·g_t/‖g_t‖_F), g_t = ∂/∂E [L + (1/K)Σ_{s<t}L(E+δ_{s+1})] (clean gradient kept);
∇θ ← ∇θL + (1/K)Σ_{t=1..K}∇θL(E+δ_t) + μ·∇θ stable_kl(f(E+δ_K), f(E)),  μ = 0.2.

References:
    Jiang et al. "SMART: Robust and Efficient Fine-Tuning for Pre-trained Natural Language Models through
    Principled Regularized Optimization." ACL 2020 — but as the ZhichunRoad code runs it ("SMART w/o
    smoothness-inducing regularisation"): the μ-term is a KL to the *clean* logits of this batch, not a
    Bregman proximal term to the previous iterate, and the paper's λ = 0.5 is unused
    (docs/recipes/idiom.md).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from raycl.adversarial.base import AdversarialMethod, Forward, stable_kl


class SMART(AdversarialMethod):
    """The code's SMART variant on the embedding matrix (best zero-shot method).

    1. For t < K: step as in PGD, never zeroing the gradients (the clean gradient also steers the steps);
    backward L_adv/K, accumulating. 2. One more forward at the final perturbed E and backward of
    μ·stable_kl(logits_adv, clean_logits), summed over the batch. Gradient = ∇L + (1/K)Σ∇L_adv,t + μ∇KL.
    E is restored.

    Args (besides :class:`AdversarialMethod`'s): mu: μ, the weight of the KL term (``adversarial.smart_mu``).

    Inputs: ``forward() -> (loss (), logits (B, C))`` and ``clean_logits`` (B, C) from the caller's clean pass.
    Degenerate cases: ε = 0 switches it off; μ = 0 with K = 1 and α ≤ ε is FGM with step α; α = 0 gives
    ∇L + ∇L for a deterministic model (the adversarial passes run at the clean E and the KL gradient is 0).
    """

    name = "smart"

    def __init__(
        self,
        model: nn.Module,
        *,
        epsilon: float = 1.0,
        alpha: float = 0.3,
        steps: int = 3,
        mu: float = 0.2,
        embedding: nn.Module | None = None,
    ) -> None:
        super().__init__(model, epsilon=epsilon, alpha=alpha, steps=steps, embedding=embedding)
        self.mu = float(mu)

    def _attack(
        self, forward: Forward, origin: Tensor, *, clean_logits: Tensor | None, loss_scale: float
    ) -> dict[str, Any]:
        if clean_logits is None:
            raise ValueError("SMART needs clean_logits: pass the logits of the caller's clean forward")
        total: Any = 0.0
        for _ in range(self.steps):
            self.ascend_and_project(origin)
            loss_adv, _ = forward()
            (loss_adv * (loss_scale / self.steps)).backward()
            total = total + loss_adv.detach()  # summed on the device: no wait for each pass
        # A separate forward at the final δ (fresh dropout), as the code does, rather than retaining a graph.
        _, logits_adv = forward()  # (B, C)
        kl = stable_kl(logits_adv, clean_logits.detach())
        (kl * (self.mu * loss_scale)).backward()
        return {"adv/loss": total / self.steps, "adv/kl": kl.detach()}
