"""Shared parts of embedding-space adversarial training, as ZhichunRoad's SemEval-2022 Task 2 code runs it.

Every method perturbs the **whole word-embedding matrix** E in place along its gradient g, normalised by the
**global Frobenius norm** ‖g‖_F of the entire matrix gradient (one norm per batch, not per token or example;
rows of tokens absent from the batch have zero gradient), runs extra forward/backward passes that *add* to
``.grad``, and restores E bit-exactly afterwards. A method never calls ``optimizer.step()`` or
``optimizer.zero_grad()``: the caller owns the clean forward/backward and the step, as in the released
training loop.

Calling convention (one batch)::

    loss, logits = forward()                       # the caller's clean pass
    loss.backward()
    adversary.attack_and_backward(forward, clean_logits=logits.detach())
    optimizer.step(); optimizer.zero_grad()

``forward`` is a closure returning ``(loss, logits)`` for the batch at the *current* embedding weights.

Degenerate case shared by all methods: ``epsilon = 0`` (an empty perturbation ball) switches the method off —
no extra pass runs and ``.grad`` is left exactly as the clean backward left it, the same as ``"none"``.
(The released code would instead run the extra passes at the clean weights and so roughly double the
gradient; nobody runs that, and "off" is what a sweep including ε = 0 means.)

References:
    Cui, Xiong, Wang. "ZhichunRoad at SemEval-2022 Task 2." SemEval 2022, §3.2 ("Adversarial Training"); the
    released ``subtaskA/utils.py`` FGM/PGD/FreeLB classes and its commented training loop; docs/recipes/idiom.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

Forward = Callable[[], tuple[Tensor, Tensor]]  # () -> (loss (), logits (B, C)) at the current embeddings

ADVERSARIAL: frozenset[str] = frozenset({"none", "fgm", "pgd", "freelb", "smart"})


def grad_norm(weight: Tensor) -> Tensor:
    """‖∂L/∂E‖_F over the whole matrix: one global norm (0 when no gradient reached E)."""
    if weight.grad is None:
        return torch.zeros((), device=weight.device)
    return torch.linalg.vector_norm(weight.grad)  # () Frobenius norm of the (V, H) gradient


@torch.no_grad()
def ascend(weight: Tensor, step: float) -> None:
    """E ← E + step·g/‖g‖_F in place; no move where ‖g‖_F = 0, as the code does. The test is made on the device
    (a factor of 0), so the host never waits for the norm."""
    if weight.grad is None:
        return
    norm = grad_norm(weight)  # ()
    factor = torch.where(norm != 0, step / norm, torch.zeros_like(norm))  # () 0 for a zero gradient
    weight.addcmul_(weight.grad, factor)  # (V, H)


@torch.no_grad()
def project(weight: Tensor, origin: Tensor, epsilon: float) -> None:
    """Project the total perturbation δ = E − E₀ onto the ball ‖δ‖_F ≤ ε (rescaled only when outside: E is left
    bit-exactly as it is inside the ball). Decided on the device: no host sync."""
    if epsilon == 0:
        weight.copy_(origin)  # the ball is the point E₀
        return
    delta = weight - origin  # (V, H)
    norm = torch.linalg.vector_norm(delta)  # ()
    outside = (norm > epsilon).to(weight.dtype)  # () 1 outside the ball, 0 inside
    delta.mul_(epsilon / torch.clamp(norm, min=epsilon)).add_(origin)  # (V, H) E₀ + δ·ε/‖δ‖ (finite everywhere)
    weight.lerp_(delta, outside)  # (V, H) exactly the projection outside, exactly E inside


def backup_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """Clones of every trainable parameter's ``.grad`` (None where there is none)."""
    return {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def restore_grads(model: nn.Module, backup: dict[str, Tensor | None], *, add: bool = False) -> None:
    """Put the backed-up gradients back (``add=True``: add them to the current ones, as FreeLB does)."""
    for name, p in model.named_parameters():
        if name not in backup:
            continue
        saved = backup[name]
        if not add:
            p.grad = None if saved is None else saved.clone()
        elif saved is not None:
            p.grad = saved.clone() if p.grad is None else p.grad + saved


def zero_grads(model: nn.Module) -> None:
    """Zero the model's gradients (what the code's ``optimizer.zero_grad()`` does inside the attack loop)."""
    for p in model.parameters():
        p.grad = None


def stable_kl(logits: Tensor, target: Tensor, *, epsilon: float = 1e-6) -> Tensor:
    """MT-DNN's ``stable_kl``: KL(p ‖ y) through detached log-odds, summed over the batch (``reduce=False``).

    p = softmax(logits), y = softmax(target), r(z) = −log(1/(z+ε) − 1 + ε) detached;
    loss = Σ_{b,c} 2·p_bc·(r(p_bc) − r(y_bc)).  Gradient flows only through p (``target`` is detached too).

    Args:
        logits: (B, C) logits at the perturbed embeddings.
        target: (B, C) clean logits.
        epsilon: the 1e-6 of the code.

    Returns:
        () the summed loss. Degenerate case: logits = target gives 0 with zero gradient.

    References:
        Jiang et al., "SMART", ACL 2020, §3 (the KL divergence of its regularisers); MT-DNN
        ``mt_dnn/perturbation.py`` (``stable_kl``), which the released ``subtaskA`` code copies.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)  # the code's .float(), without downcasting fp64
    logits = logits.reshape(-1, logits.size(-1)).to(dtype)  # (B, C)
    target = target.detach().reshape(-1, target.size(-1)).to(dtype)  # (B, C)
    p = torch.log_softmax(logits, dim=1).exp()  # (B, C)
    y = torch.log_softmax(target, dim=1).exp()  # (B, C)
    rp = -(1.0 / (p + epsilon) - 1 + epsilon).detach().log()  # (B, C)
    ry = -(1.0 / (y + epsilon) - 1 + epsilon).log()  # (B, C)
    return (p * (rp - ry) * 2).sum()


class AdversarialMethod:
    """An adversarial regulariser on the word-embedding matrix: adds its gradient, restores E, never steps.

    Args:
        model: the model whose ``.grad`` receives the extra terms (all trainable parameters).
        epsilon: radius ε of the Frobenius ball around E (FGM: the step size).
        alpha: step α of each ascent step (PGD/FreeLB/SMART).
        steps: number of ascent steps K (PGD/FreeLB/SMART).
        embedding: the module whose ``.weight`` is E; ``model.get_input_embeddings()`` by default.
    """

    name: ClassVar[str] = "none"

    def __init__(
        self,
        model: nn.Module,
        *,
        epsilon: float = 1.0,
        alpha: float = 0.3,
        steps: int = 3,
        embedding: nn.Module | None = None,
    ) -> None:
        module = embedding if embedding is not None else model.get_input_embeddings()  # type: ignore[operator]
        weight = module.weight
        if not isinstance(weight, nn.Parameter):
            raise TypeError(f"{type(module).__name__}.weight is not a Parameter: not an embedding module")
        self.model: nn.Module = model
        self.weight: nn.Parameter = weight
        self.epsilon, self.alpha, self.steps = float(epsilon), float(alpha), int(steps)

    def attack_and_backward(
        self, forward: Forward, *, clean_logits: Tensor | None = None, loss_scale: float = 1.0
    ) -> dict[str, Any]:
        """Add this method's gradient to ``.grad`` (after the caller's clean backward); E is restored after.

        ``loss_scale`` multiplies every extra backward (``1/accumulation_steps`` under gradient accumulation);
        ``clean_logits`` (B, C) is needed by SMART only. Returns scalars to log (empty when switched off), as
        detached 0-dim tensors: whoever logs them reads them when it reports, the step does not wait for them.
        """
        if self.epsilon == 0:
            return {}
        with self.restoring() as origin:
            return self._attack(forward, origin, clean_logits=clean_logits, loss_scale=loss_scale)

    def _attack(
        self, forward: Forward, origin: Tensor, *, clean_logits: Tensor | None, loss_scale: float
    ) -> dict[str, Any]:
        raise NotImplementedError

    def ascend_and_project(self, origin: Tensor) -> None:
        """One PGD step: E ← Π_{‖E−E₀‖_F≤ε}(E + α·g/‖g‖_F), g the current ``.grad`` of E."""
        ascend(self.weight, self.alpha)
        project(self.weight, origin, self.epsilon)

    @contextmanager
    def restoring(self) -> Iterator[Tensor]:
        """Back up E, yield the backup E₀, and copy it back bit-exactly whatever happens."""
        origin = self.weight.detach().clone()  # (V, H)
        try:
            yield origin
        finally:
            with torch.no_grad():
                self.weight.copy_(origin)


class NoAdversarial(AdversarialMethod):
    """``adversarial.name = none``: plain training; ``attack_and_backward`` does nothing."""

    def attack_and_backward(
        self, forward: Forward, *, clean_logits: Tensor | None = None, loss_scale: float = 1.0
    ) -> dict[str, Any]:
        return {}
