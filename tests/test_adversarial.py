"""Adversarial training parts (ZhichunRoad) against naive references written here, on a tiny float64 model.

The references never touch the module under test: they re-run the model functionally on a perturbed copy of
the embedding matrix, with the global Frobenius norm computed in a plain Python loop.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from raycl.adversarial import build_adversarial
from raycl.adversarial.base import ADVERSARIAL, NoAdversarial, ascend, project, stable_kl
from raycl.adversarial.fgm import FGM
from raycl.adversarial.freelb import FreeLB
from raycl.adversarial.pgd import PGD
from raycl.adversarial.smart import SMART
from raycl.errors import UserError
from raycl.training.counting import count_ops

V, H, C = 9, 4, 3
IDS = torch.tensor([[1, 2, 3, 2], [4, 1, 5, 6]])  # rows 0, 7, 8 of E never appear: zero gradient there
LABELS = torch.tensor([2, 0])


class Tiny(nn.Module):
    """Embedding → mean over tokens → tanh → linear: small, deterministic, nonlinear in E."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(V, H)
        self.out = nn.Linear(H, C)
        self.double()

    def get_input_embeddings(self) -> nn.Module:
        return self.emb

    def forward(self, ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.out(torch.tanh(self.emb(ids).mean(1)))
        return nn.functional.cross_entropy(logits, labels), logits


# --- naive references ----------------------------------------------------------------------------------


def ref_logits(params: dict[str, Tensor], emb: Tensor) -> Tensor:
    rows = [torch.stack([emb[int(i)] for i in seq]).mean(0) for seq in IDS]
    return torch.tanh(torch.stack(rows)) @ params["out.weight"].T + params["out.bias"]


def ref_grads(model: Tiny, emb: Tensor, *, kl_target: Tensor | None = None) -> dict[str, Tensor]:
    """Gradients of the loss (or of the naive stable KL to ``kl_target``) with E replaced by ``emb``."""
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    e = emb.detach().clone().requires_grad_(True)
    logits = ref_logits(params, e)
    if kl_target is None:
        loss = nn.functional.cross_entropy(logits, LABELS)
    else:
        loss = naive_kl_with_grad_through_p(logits, kl_target)
    gw, gb, ge = torch.autograd.grad(loss, [params["out.weight"], params["out.bias"], e])
    return {"emb.weight": ge, "out.weight": gw, "out.bias": gb}


def frob(x: Tensor) -> float:
    return math.sqrt(sum(float(v) ** 2 for v in x.flatten()))


def proj(delta: Tensor, eps: float) -> Tensor:
    n = frob(delta)
    return delta * (eps / n) if n > eps else delta


def r(z: float) -> float:
    return -math.log(1.0 / (z + 1e-6) - 1 + 1e-6)


def softmax_row(row: list[float]) -> list[float]:
    m = max(row)
    ex = [math.exp(v - m) for v in row]
    return [v / sum(ex) for v in ex]


def naive_kl(logits: Tensor, target: Tensor) -> float:
    total = 0.0
    for zl, zt in zip(logits.tolist(), target.tolist(), strict=True):
        p, y = softmax_row(zl), softmax_row(zt)
        total += sum(2 * pc * (r(pc) - r(yc)) for pc, yc in zip(p, y, strict=True))
    return total


def naive_kl_with_grad_through_p(logits: Tensor, target: Tensor) -> Tensor:
    """Σ 2p(r(p) − r(y)) with r(·) frozen as constants: autograd then sees only the p factor."""
    p = torch.softmax(logits, 1)
    const = [
        [2 * (r(pc) - r(yc)) for pc, yc in zip(pr, yr, strict=True)]
        for pr, yr in zip(p.tolist(), torch.softmax(target, 1).tolist(), strict=True)
    ]
    return (p * torch.tensor(const, dtype=p.dtype)).sum()


def add(a: dict[str, Tensor], b: dict[str, Tensor], scale: float = 1.0) -> dict[str, Tensor]:
    return {k: a[k] + scale * b[k] for k in a}


# --- helpers -------------------------------------------------------------------------------------------


def clean_backward(model: Tiny) -> Tensor:
    loss, logits = model(IDS, LABELS)
    loss.backward()
    return logits.detach()


def grads_of(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def run(method_cls: type, *, seed: int = 0, **kw: float) -> tuple[Tiny, dict[str, Tensor]]:
    model = Tiny(seed)
    logits = clean_backward(model)
    method_cls(model, **kw).attack_and_backward(lambda: model(IDS, LABELS), clean_logits=logits)
    return model, grads_of(model)


def assert_grads_close(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-12, msg=k)


# --- tests ---------------------------------------------------------------------------------------------


def test_fgm_matches_naive_reference() -> None:
    model = Tiny()
    e0 = model.emb.weight.detach().clone()
    g0 = ref_grads(model, e0)
    e_adv = e0 + 1.0 * g0["emb.weight"] / frob(g0["emb.weight"])  # ε = 1, global norm over all V×H entries
    _, got = run(FGM, epsilon=1.0)
    assert_grads_close(got, add(g0, ref_grads(model, e_adv)))


@pytest.mark.parametrize("alpha,steps", [(0.3, 3), (0.8, 3), (0.5, 2)])
def test_pgd_matches_naive_reference(alpha: float, steps: int) -> None:
    model, eps = Tiny(), 1.0
    e0 = model.emb.weight.detach().clone()
    g0 = ref_grads(model, e0)
    delta, direction = torch.zeros_like(e0), g0["emb.weight"]
    for _ in range(steps):
        delta = proj(delta + alpha * direction / frob(direction), eps)
        g_t = ref_grads(model, e0 + delta)
        direction = g_t["emb.weight"]  # PGD zeroes the gradients: only the last adversarial gradient steers
    _, got = run(PGD, epsilon=eps, alpha=alpha, steps=steps)
    assert_grads_close(got, add(g0, g_t))


@pytest.mark.parametrize("alpha,steps", [(0.3, 3), (0.8, 3)])
def test_freelb_matches_naive_reference(alpha: float, steps: int) -> None:
    model, eps = Tiny(), 1.0
    e0 = model.emb.weight.detach().clone()
    g0 = ref_grads(model, e0)
    delta, direction = torch.zeros_like(e0), g0["emb.weight"]
    acc = {k: torch.zeros_like(v) for k, v in g0.items()}
    for _ in range(steps):
        delta = proj(delta + alpha * direction / frob(direction), eps)
        acc = add(acc, ref_grads(model, e0 + delta), 1.0 / steps)
        direction = acc["emb.weight"]  # the clean gradient is zeroed after step 0
    _, got = run(FreeLB, epsilon=eps, alpha=alpha, steps=steps)
    assert_grads_close(got, add(g0, acc))


@pytest.mark.parametrize("alpha,steps,mu", [(0.3, 3, 0.2), (0.8, 2, 1.5)])
def test_smart_is_clean_plus_mean_adversarial_plus_mu_kl(alpha: float, steps: int, mu: float) -> None:
    model, eps = Tiny(), 1.0
    e0 = model.emb.weight.detach().clone()
    g0 = ref_grads(model, e0)
    clean_logits = ref_logits(dict(model.named_parameters()), e0).detach()
    delta, acc = torch.zeros_like(e0), {k: torch.zeros_like(v) for k, v in g0.items()}
    for _ in range(steps):
        direction = g0["emb.weight"] + acc["emb.weight"]  # the clean gradient stays in and steers every step
        delta = proj(delta + alpha * direction / frob(direction), eps)
        acc = add(acc, ref_grads(model, e0 + delta), 1.0 / steps)
    g_kl = ref_grads(model, e0 + delta, kl_target=clean_logits)  # each term computed on its own
    _, got = run(SMART, epsilon=eps, alpha=alpha, steps=steps, mu=mu)
    assert_grads_close(got, add(add(g0, acc), g_kl, mu))


def test_one_step_pgd_freelb_and_smart_without_kl_equal_fgm() -> None:
    _, fgm = run(FGM, epsilon=0.7)
    for cls, kw in [(PGD, {}), (FreeLB, {}), (SMART, {"mu": 0.0})]:
        _, other = run(cls, epsilon=0.7, alpha=0.7, steps=1, **kw)
        assert_grads_close(other, fgm)


@pytest.mark.parametrize("cls", [FGM, PGD, FreeLB, SMART])
def test_epsilon_zero_switches_the_method_off(cls: type) -> None:
    """ε = 0 (all four methods): no extra pass runs and ``.grad`` is bit-identical to the clean backward."""
    model = Tiny()
    logits = clean_backward(model)
    before, calls = grads_of(model), []

    def forward() -> tuple[Tensor, Tensor]:
        calls.append(1)
        return model(IDS, LABELS)

    assert cls(model, epsilon=0.0).attack_and_backward(forward, clean_logits=logits) == {}
    assert calls == []
    for k, v in grads_of(model).items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("cls", [PGD, FreeLB, SMART])
def test_alpha_zero_doubles_the_clean_gradient(cls: type) -> None:
    """α = 0: every adversarial pass runs at the clean E (SMART's KL is 0 with zero gradient there)."""
    model = Tiny()
    g0 = ref_grads(model, model.emb.weight.detach())
    _, got = run(cls, epsilon=1.0, alpha=0.0, steps=3)
    assert_grads_close(got, add(g0, g0))


@pytest.mark.parametrize("cls", [PGD, FreeLB, SMART])
def test_projection_keeps_delta_in_the_ball(cls: type) -> None:
    model, eps = Tiny(), 0.5
    e0 = model.emb.weight.detach().clone()
    logits, norms = clean_backward(model), []

    def forward() -> tuple[Tensor, Tensor]:
        norms.append(frob(model.emb.weight.detach() - e0))
        return model(IDS, LABELS)

    cls(model, epsilon=eps, alpha=0.4, steps=3).attack_and_backward(forward, clean_logits=logits)
    assert len(norms) >= 3 and all(n <= eps + 1e-12 for n in norms)
    assert norms[-1] == pytest.approx(eps)  # 3 steps of 0.4 leave the ball: the projection acted


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_weights_restored_bit_exactly_and_nothing_stepped(name: str) -> None:
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logits = clean_backward(model)
    build_adversarial(name, model, alpha=0.7).attack_and_backward(lambda: model(IDS, LABELS), clean_logits=logits)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    assert not optimizer.state  # never stepped


def test_weights_restored_when_the_forward_fails() -> None:
    model = Tiny()
    e0 = model.emb.weight.detach().clone()
    clean_backward(model)

    def failing() -> tuple[Tensor, Tensor]:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        PGD(model).attack_and_backward(failing)
    assert torch.equal(model.emb.weight.detach(), e0)


def test_loss_scale_scales_only_the_adversarial_terms() -> None:
    model = Tiny()
    e0 = model.emb.weight.detach().clone()
    g0 = ref_grads(model, e0)
    g_adv = ref_grads(model, e0 + g0["emb.weight"] / frob(g0["emb.weight"]))
    model = Tiny()
    clean_backward(model)
    FGM(model).attack_and_backward(lambda: model(IDS, LABELS), loss_scale=0.25)
    assert_grads_close(grads_of(model), add(g0, g_adv, 0.25))


@pytest.mark.parametrize(("cls", "steps"), [(PGD, 2), (SMART, 1)])
def test_pgd_and_smart_scale_their_adversarial_passes_by_the_loss_scale(cls: type, steps: int) -> None:
    """Their ascent steps along g/‖g‖_F of gradients the scale does not change (PGD zeroes the adversarial ones,
    a one-step SMART has only the clean one): the added gradient, KL term included, scales with loss_scale."""
    clean = Tiny()
    clean_backward(clean)
    g0 = grads_of(clean)
    _, g1 = run(cls, alpha=0.4, steps=steps)
    model = Tiny()
    logits = clean_backward(model)
    cls(model, alpha=0.4, steps=steps).attack_and_backward(
        lambda: model(IDS, LABELS), clean_logits=logits, loss_scale=0.25
    )
    assert_grads_close(grads_of(model), add(g0, {k: g1[k] - g0[k] for k in g0}, 0.25))


def test_stable_kl_matches_naive_loop_and_flows_only_through_p() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    target = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    kl = stable_kl(logits, target)
    assert float(kl.detach()) == pytest.approx(naive_kl(logits.detach(), target.detach()), rel=1e-6)
    kl.backward()
    assert target.grad is None
    p, y = torch.softmax(logits.detach(), 1).tolist(), torch.softmax(target.detach(), 1).tolist()
    for b in range(4):
        for j in range(3):  # d/dz_j Σ_c 2(r(p_c) − r(y_c))·p_c = Σ_c 2(r(p_c) − r(y_c))·p_c(δ_cj − p_j)
            want = sum(2 * (r(p[b][c]) - r(y[b][c])) * p[b][c] * ((c == j) - p[b][j]) for c in range(3))
            assert float(logits.grad[b, j]) == pytest.approx(want, rel=1e-6, abs=1e-12)
    same = stable_kl(logits.detach(), logits.detach())
    assert abs(float(same)) < 1e-9  # KL(p ‖ p) = 0


def test_stable_kl_of_per_token_logits_sums_over_every_position() -> None:
    """(B, T, C) logits (a token classifier's) are B·T rows of C classes: the naive KL summed over all of them."""
    torch.manual_seed(3)
    logits, target = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    want = naive_kl(logits.reshape(10, 3), target.reshape(10, 3))
    assert float(stable_kl(logits, target)) == pytest.approx(want, rel=1e-6)


def test_stable_kl_of_half_precision_logits_is_computed_in_fp32() -> None:
    torch.manual_seed(2)
    logits, target = torch.randn(4, 3).bfloat16(), torch.randn(4, 3).bfloat16()
    got = stable_kl(logits, target)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(stable_kl(logits.float(), target.float())), rel=1e-6)


def test_smart_needs_clean_logits() -> None:
    model = Tiny()
    clean_backward(model)
    with pytest.raises(ValueError, match=r"^SMART needs clean_logits: pass the logits of the caller's clean forw"):
        SMART(model).attack_and_backward(lambda: model(IDS, LABELS))


def test_build_adversarial_defaults_and_user_errors() -> None:
    model = Tiny()
    smart = build_adversarial("smart", model)
    assert isinstance(smart, SMART)
    assert (smart.epsilon, smart.alpha, smart.steps, smart.mu) == (1.0, 0.3, 3, 0.2)
    assert smart.weight is model.emb.weight
    with pytest.raises(UserError, match=r"^adversarial\.name: unknown method 'vat'"):
        build_adversarial("vat", model)
    with pytest.raises(UserError, match=r"^adversarial\.epsilon: expected ε ≥ 0"):
        build_adversarial("fgm", model, epsilon=-1.0)
    with pytest.raises(UserError, match=r"^adversarial\.steps"):
        build_adversarial("pgd", model, steps=0)
    for key, kw, symbol in (
        ("epsilon", {"epsilon": -0.5}, "ε ≥ 0"),
        ("alpha", {"alpha": -0.5}, "α ≥ 0"),
        ("steps", {"steps": 0}, "K ≥ 1"),
        ("smart_mu", {"smart_mu": -0.5}, "μ ≥ 0"),
    ):
        bad = next(iter(kw.values()))
        with pytest.raises(UserError, match=rf"^adversarial\.{key}: expected {symbol}, got {bad}$"):
            build_adversarial("smart", model, **kw)
    # the bounds themselves are accepted: ε = α = μ = 0, K = 1
    edge = build_adversarial("smart", model, epsilon=0.0, alpha=0.0, steps=1, smart_mu=0.0)
    assert (edge.epsilon, edge.alpha, edge.steps, edge.mu) == (0.0, 0.0, 1, 0.0)
    for name, cls in (("none", NoAdversarial), ("fgm", FGM), ("pgd", PGD), ("freelb", FreeLB)):
        got = build_adversarial(name, model, epsilon=0.5, alpha=0.1, steps=2)
        assert type(got) is cls and (got.epsilon, got.alpha, got.steps) == (0.5, 0.1, 2), name


def test_hf_model_embedding_is_found_and_restored_under_dropout() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = {"input_ids": torch.tensor([[2, 5, 7, 3], [2, 9, 3, 0]]), "labels": torch.tensor([0, 1])}

    def forward() -> tuple[Tensor, Tensor]:
        out = model(**batch)
        return out.loss, out.logits

    loss, logits = forward()
    loss.backward()
    clean_emb_grad = model.bert.embeddings.word_embeddings.weight.grad.clone()
    stats = build_adversarial("smart", model).attack_and_backward(forward, clean_logits=logits.detach())
    assert set(stats) == {"adv/loss", "adv/kl"}
    assert not torch.equal(model.bert.embeddings.word_embeddings.weight.grad, clean_emb_grad)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n


def test_ascend_and_project_decide_on_the_device_as_the_code_does() -> None:
    """No move for a zero (or absent) gradient; a step of exactly ``step`` along g/‖g‖ otherwise; the projection
    leaves a point inside the ball bit-exactly, puts one outside on the sphere along δ, and ε = 0 gives E₀."""
    torch.manual_seed(0)
    origin = torch.randn(V, H, dtype=torch.float64)  # E₀ ≠ 0: (E − E₀) + E₀ is not E bit for bit
    w = nn.Parameter(origin + 0.1 * torch.randn(V, H, dtype=torch.float64))
    before = w.detach().clone()
    for grad in (None, torch.zeros(V, H, dtype=torch.float64)):
        w.grad = grad
        ascend(w, 0.7)
        assert torch.equal(w.detach(), before)
    w.grad = torch.randn(V, H, dtype=torch.float64)
    ascend(w, 0.7)
    torch.testing.assert_close(w.detach(), before + 0.7 * w.grad / frob(w.grad), rtol=1e-12, atol=1e-12)
    inside, delta = w.detach().clone(), w.detach() - origin
    project(w, origin, frob(delta) + 1e-3)
    assert torch.equal(w.detach(), inside)
    project(w, origin, 0.25)
    assert frob(w.detach() - origin) == pytest.approx(0.25, rel=1e-12)
    torch.testing.assert_close(w.detach(), origin + delta * (0.25 / frob(delta)), rtol=1e-12, atol=1e-15)
    project(w, origin, 0.0)
    assert torch.equal(w.detach(), origin)


@pytest.mark.parametrize("name", ["fgm", "pgd", "freelb", "smart"])
def test_attacks_never_wait_for_the_device_and_report_their_losses(name: str) -> None:
    """Norm tests, projections and the logged losses stay on the device (the CPU stands in for it): 0 syncs. The
    returned 0-dim tensors are the adversarial passes' losses: FGM's one, PGD's last, the mean over K (FreeLB,
    SMART) and SMART's KL."""
    model = Tiny()
    logits, losses = clean_backward(model), []

    def forward() -> tuple[Tensor, Tensor]:
        loss, out = model(IDS, LABELS)
        losses.append(loss.detach().clone())
        return loss, out

    method = build_adversarial(name, model, epsilon=0.5, alpha=0.4, steps=3)
    with count_ops(cpu_as_device=True) as c:
        stats = method.attack_and_backward(forward, clean_logits=logits)
    assert c.syncs == 0, c.sync_sites
    assert all(isinstance(v, Tensor) and v.dim() == 0 for v in stats.values())
    adv = {"fgm": losses[0], "pgd": losses[-1], "freelb": sum(losses) / 3, "smart": sum(losses[:3]) / 3}[name]
    assert float(stats["adv/loss"]) == pytest.approx(float(adv), rel=1e-12)


def test_defaults_are_the_papers_and_an_embedding_given_is_the_one_perturbed() -> None:
    model = Tiny()
    pgd, smart = PGD(model), SMART(model)
    assert (pgd.epsilon, pgd.alpha, pgd.steps) == (1.0, 0.3, 3)
    assert (smart.epsilon, smart.alpha, smart.steps, smart.mu) == (1.0, 0.3, 3, 0.2)
    other = nn.Embedding(V, H)
    assert SMART(nn.Module(), embedding=other).weight is other.weight  # no get_input_embeddings needed
    assert PGD(nn.Module(), embedding=other).weight is other.weight


def test_an_embedding_without_a_weight_parameter_is_refused_by_name() -> None:
    class NoWeight(nn.Module):
        weight = torch.zeros(2)

    with pytest.raises(TypeError, match=r"^NoWeight.weight is not a Parameter: not an embedding module$"):
        PGD(Tiny(), embedding=NoWeight())


def test_grad_norm_of_no_gradient_is_a_zero_scalar_on_the_weights_device() -> None:
    from raycl.adversarial.base import grad_norm

    norm = grad_norm(nn.Parameter(torch.ones(3, 2, device="meta")))  # meta stands in for an accelerator
    assert norm.shape == () and norm.device.type == "meta"
    assert grad_norm(nn.Parameter(torch.ones(3, 2))).item() == 0.0


def test_backup_and_restore_keep_missing_gradients_missing_and_skip_unknown_names() -> None:
    from raycl.adversarial.base import backup_grads, restore_grads

    model = Tiny()
    model.out.weight.grad = torch.ones_like(model.out.weight)
    backup = backup_grads(model)
    assert backup["emb.weight"] is None and torch.equal(backup["out.weight"], model.out.weight.grad)
    model.emb.weight.grad = torch.ones_like(model.emb.weight)
    model.out.weight.grad = None
    restore_grads(model, backup)  # a gradient absent when backed up is absent again
    assert model.emb.weight.grad is None and torch.equal(model.out.weight.grad, torch.ones_like(model.out.weight))
    model.out.weight.grad = None
    restore_grads(model, {"out.weight": backup["out.weight"]}, add=True)  # emb.weight, first, not in it: skipped
    assert model.emb.weight.grad is None and torch.equal(model.out.weight.grad, torch.ones_like(model.out.weight))
