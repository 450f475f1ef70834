"""Two data-parallel shards give the global loss: gradients summed over 2 gloo workers, each loss scaled by
its share of the tokens, equal the single-process gradient of the whole batch (fairseq's per-token scaling)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import BartConfig, BartForConditionalGeneration

from raycl.collectives import average_gradients
from raycl.data.gec import GecExample
from raycl.losses.gec_margin import GecContrastiveLoss
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.models.tokenizer import train_bpe_tokenizer
from raycl.recipes.gec.step import collate, gec_loss

EXAMPLES = [
    GecExample("a", "He do n't like it .", "He does n't like it ."),
    GecExample("b", "This are a long sentence , is n't it ?", "This is a long sentence , is n't it ?"),
    GecExample("c", "Fine .", "Fine ."),
    GecExample("d", "I has went to the school yesterday .", "I went to school yesterday ."),
]
NEGATIVES = [["He did n't like it ."], [], ["Fine !"], ["I have went to school yesterday .", "I go to school ."]]


def _scorer(tok_dir: Path) -> Seq2SeqScorer:
    texts = [t for e in EXAMPLES for t in (e.source, e.target)] + [n for ns in NEGATIVES for n in ns]
    tokenizer = train_bpe_tokenizer(texts * 3, tok_dir, vocab_size=300)
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        dropout=0.0,
    )
    return Seq2SeqScorer(BartForConditionalGeneration(config).double().eval(), tokenizer)


def _grads(scorer: Seq2SeqScorer, rows: list[int]) -> dict[str, torch.Tensor]:
    batch = collate([EXAMPLES[i] for i in rows], [NEGATIVES[i] for i in rows], scorer.tokenizer, max_length=32)
    out = gec_loss(scorer, batch, GecContrastiveLoss(margin=5.0, trade_off=0.5, label_smoothing=0.1))
    scorer.zero_grad()
    (out.loss * float(out.ntokens)).backward()  # the loop's ctx.backward(loss, weight=ntokens)
    average_gradients(list(scorer.parameters()), float(out.ntokens))
    return {n: p.grad.clone() for n, p in scorer.named_parameters() if p.grad is not None}


def _worker(rank: int, tok_dir: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    shard = [0, 1] if rank == 0 else [2, 3]  # unequal token counts per shard
    grads = _grads(_scorer(Path(tok_dir) / str(rank)), shard)  # own folder: no race on the tokenizer files
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


def test_two_shards_equal_the_whole_batch(tmp_path: Path) -> None:
    whole = _grads(_scorer(tmp_path / "tok"), [0, 1, 2, 3])
    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(str(tmp_path / "tok"), port, str(tmp_path / "g.pt")), nprocs=2, join=True)
    sharded = torch.load(tmp_path / "g.pt")
    assert whole.keys() == sharded.keys() and len(whole) > 10
    for name, g in whole.items():
        torch.testing.assert_close(sharded[name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_one_worker_is_the_plain_backward(tmp_path: Path) -> None:
    scorer = _scorer(tmp_path / "tok")
    batch = collate(EXAMPLES, NEGATIVES, scorer.tokenizer, max_length=32)
    out = gec_loss(scorer, batch, GecContrastiveLoss(margin=5.0))
    out.loss.backward()
    plain = {n: p.grad.clone() for n, p in scorer.named_parameters() if p.grad is not None}
    for n, g in _grads(scorer, [0, 1, 2, 3]).items():  # (loss·n)' / n: equal up to float64 rounding
        torch.testing.assert_close(g, plain[n], rtol=1e-12, atol=1e-15, msg=n)


def test_shards_have_equal_length_and_cover_every_example() -> None:
    from raycl.training.batching import shard

    for n, world in [(999, 2), (17, 2), (10, 3), (4, 4), (1, 2)]:
        examples = [GecExample(str(i), "s", "t") for i in range(n)]
        shards = [shard(examples, r, world) for r in range(world)]
        assert len({len(s) for s in shards}) == 1  # same number of steps on every rank
        ids = [e.id for s in shards for e in s]
        assert len(ids) == len(set(ids))  # padding copies get ids of their own (the ledger needs unique ids)
        assert {i.removesuffix("#pad") for i in ids} == {e.id for e in examples}


def _uneven_worker(rank: int, port: int, out: str) -> None:
    """Rank 0 makes 3 updates, rank 1 one (token budgets cut their epochs differently), then joins the rest; a
    parameter only rank 0 uses, and one no rank uses."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 1)]
    got = []
    for i in range(3 if rank == 0 else 1):
        params[0].grad = torch.full((3,), float(rank + 1 + i))
        params[1].grad = torch.ones(2) if rank == 0 else None
        active = average_gradients(params, 2.0)
        got.append((active, params[0].grad.tolist(), params[1].grad.tolist(), params[2].grad))
    rounds = 0
    while True:  # the loop's join: no batch left, take part with zero weight and no gradients
        for p in params:
            p.grad = None
        active = average_gradients(params, 0.0, active=False)
        if not active:
            break
        got.append((active, params[0].grad.tolist(), params[1].grad.tolist(), params[2].grad))
        rounds += 1
    torch.save({"got": got, "rounds": rounds}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_a_rank_out_of_batches_joins_the_others_updates(tmp_path: Path) -> None:
    port = 29700 + os.getpid() % 1000
    mp.spawn(_uneven_worker, args=(port, str(tmp_path / "u.pt")), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"u.pt.{r}") for r in range(2))
    assert r0["rounds"] == 0 and r1["rounds"] == 2  # rank 1 joined rank 0's last two updates
    (a1, g1, h1, n1), (a2, g2, h2, _), (a3, g3, _, _) = r0["got"]
    assert a1 and g1 == [(1 + 2) / 4] * 3  # both ranks: summed grads ÷ the global weight (2 + 2)
    assert h1 == [1 / 4] * 2  # used on rank 0 only: rank 1 adds zeros
    assert n1 is None  # used on no rank: no gradient, as with one worker (AdamW neither decays nor counts it)
    assert a2 and g2 == [2 / 2] * 3  # rank 1 joined with zero gradients and no weight: ÷ 2, rank 0's alone
    assert a3 and g3 == [3 / 2] * 3
    assert [g[1] for g in r1["got"][1:]] == [g2, g3]  # the joined rank holds the same gradient as the active one
