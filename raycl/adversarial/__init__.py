"""Adversarial training terms (FGM, PGD, FreeLB, SMART): each adds its gradient to ``.grad``, never steps.
:func:`build_adversarial` picks one by name (it lives here, above the methods, so that ``base`` imports none of
its subclasses)."""

from __future__ import annotations

from torch import nn

from raycl.adversarial.base import ADVERSARIAL, AdversarialMethod, NoAdversarial
from raycl.adversarial.fgm import FGM
from raycl.adversarial.freelb import FreeLB
from raycl.adversarial.pgd import PGD
from raycl.adversarial.smart import SMART
from raycl.errors import UserError


def build_adversarial(
    name: str,
    model: nn.Module,
    *,
    epsilon: float = 1.0,
    alpha: float = 0.3,
    steps: int = 3,
    smart_mu: float = 0.2,
) -> AdversarialMethod:
    """The method called ``name`` (one of :data:`ADVERSARIAL`) with the paper's constants by default."""
    if name not in ADVERSARIAL:
        raise UserError(f"adversarial.name: unknown method {name!r}; expected one of {sorted(ADVERSARIAL)}")
    _check(epsilon >= 0, "adversarial.epsilon", f"expected ε ≥ 0, got {epsilon}")
    _check(alpha >= 0, "adversarial.alpha", f"expected α ≥ 0, got {alpha}")
    _check(steps >= 1, "adversarial.steps", f"expected K ≥ 1, got {steps}")
    _check(smart_mu >= 0, "adversarial.smart_mu", f"expected μ ≥ 0, got {smart_mu}")
    if name == "smart":
        return SMART(model, epsilon=epsilon, alpha=alpha, steps=steps, mu=smart_mu)
    classes: dict[str, type[AdversarialMethod]] = {"none": NoAdversarial, "fgm": FGM, "pgd": PGD, "freelb": FreeLB}
    return classes[name](model, epsilon=epsilon, alpha=alpha, steps=steps)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise UserError(f"{key}: {message}")
