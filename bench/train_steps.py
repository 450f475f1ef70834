"""The training steps ``bench/train.py`` measures: each recipe's model built from a config (random weights, nothing
downloaded), a batch at its paper's shape, and the recipe's own step run through the one training loop.

Shapes: ``paper`` (GEC: ``bart-large``) is the papers' model — BART-large; InfoXLM-base (XLM-R-base's config) for
idiom; multilingual BERT-base with the cross-attention and the MoCo queue for STS; XLNet-base for coherence.
``narrow`` keeps each model's layers, heads and vocabulary at a small width: the aten ops and syncs of a step
depend on the layout, not on the width, so a CPU counts them in seconds. ``smoke`` is the recipe's own smoke run
(its preset, built-in data, ``task.build`` and ``task.stream``: ``bench/train_smoke.py``) — what ``raycl.train
<recipe> --preset smoke`` trains.

What each step receives is made by one small function per recipe (``*_micro_batches``): the raw examples, which
the recipe's own ``collate`` turns into tensors on the device before anything is measured — as the loop's
prefetcher does ahead of the step (GEC's batch is made as ids directly, already collated).
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

GEC_SHAPES = {  # BartConfig fields
    "bart-large": dict(
        vocab_size=50265,
        d_model=1024,
        encoder_layers=12,
        decoder_layers=12,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        max_position_embeddings=1024,
    ),
    "small": dict(
        vocab_size=8000,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_position_embeddings=256,
    ),
    # BART-large's layout (12 + 12 layers, 16 heads) at width 64: the same ops and syncs, a CPU counts it fast
    "narrow": dict(
        vocab_size=1024,
        d_model=64,
        encoder_layers=12,
        decoder_layers=12,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        max_position_embeddings=1024,
    ),
}
_NARROW = dict(hidden_size=96, intermediate_size=384)  # 12 heads of 8: the base models' layout, thin
ENCODER_SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    # microsoft/infoxlm-base: XLM-R-base's config
    "idiom": {
        "paper": dict(
            vocab_size=250002,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=514,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
        )
    },
    # bert-base-multilingual-cased
    "sts": {
        "paper": dict(
            vocab_size=119547,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            type_vocab_size=2,
        )
    },
    # xlnet-base-cased
    "coherence": {"paper": dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072, mem_len=None)},
}
for _r, _s in ENCODER_SHAPES.items():
    _p = _s["paper"]
    _s["narrow"] = {**_p, "d_model": 96, "d_inner": 384} if _r == "coherence" else {**_p, **_NARROW}
PAPER_BATCH = {"gec": 16, "idiom": 16, "sts": 32, "coherence": 1}  # idiom: zero-shot 16, one-shot 32
PAPER_LEN = {"idiom": 128, "sts": 64, "coherence": 600}  # tokens of an input (coherence: text before <sep><cls>)


@dataclass
class Case:
    """One training step of a recipe, ready for the loop: its task, state and micro-batches."""

    task: Any  # a raycl.training.loop Task
    state: Any  # its TrainState
    batches: list[Any]  # the step's raycl.training.task.Batch list (STS alternates two objectives: two)
    tokens: int  # input tokens of the trained passes (GEC: fairseq's num_tokens: source + whole target line)
    items: int  # examples a step


# ---------------------------------------------------------------------------------------------- synthetic text
def words(n: int = 600, seed: int = 0) -> list[str]:
    """Pseudo-words for a local BPE: realistic word lengths, no corpus needed."""
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(n)]


def sentence(rng: random.Random, vocab: list[str], lo: int, hi: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) + "."


# ---------------------------------------------------------------------------------------------- GEC
def gec_model(shape: str, device: torch.device) -> Any:
    from transformers import BartConfig, BartForConditionalGeneration

    from raycl.models.seq2seq import Seq2SeqScorer

    torch.manual_seed(0)
    config = BartConfig(
        **GEC_SHAPES[shape], dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2
    )
    tokenizer = SimpleNamespace(pad_token_id=1, eos_token_id=2)  # ids are made here: no vocabulary needed
    return Seq2SeqScorer(BartForConditionalGeneration(config), tokenizer).to(device)  # type: ignore[arg-type]


def gec_micro_batches(b: int, args: Any, vocab: int, device: torch.device) -> list[Any]:
    """What the GEC step receives: a collated batch of ``b`` sentences, ``args.negatives`` each."""
    from raycl.testing.gec_batches import batch_from_tensors
    from raycl.training.task import Batch

    g = torch.Generator().manual_seed(b)

    def ids(*shape: int) -> torch.Tensor:
        t = torch.randint(4, vocab, shape, generator=g)
        t[..., -1] = 2  # </s>
        return t

    src = ids(b, args.src_len)
    batch = batch_from_tensors(
        src,
        torch.ones_like(src),
        ids(b, args.tgt_len),
        ids(b, args.negatives, args.tgt_len),
        torch.full((b,), args.negatives),
        pad_id=1,
    )
    return [Batch(batch)]


def gec_case(model: Any, b: int, args: Any, device: torch.device) -> Case:
    from raycl.config.tasks.gec import GecConfig
    from raycl.losses.gec_margin import GecContrastiveLoss
    from raycl.recipes.gec.worker import GecState, GecTask

    @dataclass(frozen=True)
    class BenchGecTask(GecTask):
        def collate(self, st: Any, data: Any) -> Any:  # a batch made as ids: collated already
            return data

        def after_update(self, st: Any) -> None:  # no feed
            pass

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    st = GecState(model, [opt], [None], {}, loss_fn=GecContrastiveLoss(margin=0.25, trade_off=0.5))
    tokens = b * (args.src_len + args.tgt_len * (1 + args.negatives))
    batches = gec_micro_batches(b, args, model.model.config.vocab_size, device)
    cfg = GecConfig()
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, passes=getattr(args, "passes", "joint")))
    return Case(BenchGecTask(cfg, "finetune"), st, batches, tokens, b)


# ---------------------------------------------------------------------------------------------- idiom
def idiom_model(shape: str, device: torch.device, tmp: Path) -> tuple[Any, Any]:
    """InfoXLM-base's shape (XLM-R-base: a RoBERTa classifier) and a local BPE with RoBERTa's special ids."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from raycl.models.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(words(), tmp / "idiom-tok", vocab_size=1000, model_max_length=512)
    torch.manual_seed(0)
    config = RobertaConfig(
        **ENCODER_SHAPES["idiom"][shape], num_labels=2, pad_token_id=1, bos_token_id=0, eos_token_id=2
    )
    return RobertaForSequenceClassification(config).to(device), tokenizer


def idiom_micro_batches(b: int, seed: int = 0) -> list[Any]:
    """What the idiom step receives: ``b`` zero-shot rows (previous, target, next), most over 128 tokens."""
    from raycl.data.semeval import IdiomExample
    from raycl.training.task import Batch

    rng, vocab = random.Random(seed), words()
    rows = [
        IdiomExample(
            f"r{i}",
            "EN",
            "big fish",
            sentence(rng, vocab, 10, 40),
            sentence(rng, vocab, 8, 30),
            sentence(rng, vocab, 10, 40),
            label=i % 2,
            setting="zero_shot",
        )
        for i in range(b)
    ]
    return [Batch(rows)]


def idiom_case(model: Any, tokenizer: Any, b: int, args: Any, device: torch.device) -> Case:
    from raycl.adversarial import build_adversarial
    from raycl.config.tasks.idiom import IdiomConfig
    from raycl.memory.ema import EMA
    from raycl.recipes.idiom.worker import IdiomState, IdiomTask

    cfg = IdiomConfig()
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, setting="zero_shot"),
        adversarial=dataclasses.replace(cfg.adversarial, method=args.adversarial),
    )
    a = cfg.adversarial
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    adversary = build_adversarial(a.method, model, epsilon=a.epsilon, alpha=a.alpha, steps=a.steps)
    batches = idiom_micro_batches(b)
    st = IdiomState(
        model,
        [opt],
        [None],
        {},
        {"ema": EMA(model, decay=cfg.ema.decay)},
        tokenizer=tokenizer,
        examples=batches[0].data,
        adversary=adversary,
    )
    return Case(IdiomTask(cfg), st, batches, b * PAPER_LEN["idiom"], b)


# ---------------------------------------------------------------------------------------------- STS
def sts_model(shape: str, device: torch.device, tmp: Path) -> Any:
    """Multilingual BERT-base's shape, the cross-attention, a local BPE (pad id 1)."""
    from transformers import BertConfig, BertModel

    from raycl.models.sentence_encoder import SentenceEncoder
    from raycl.models.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(words(), tmp / "sts-tok", vocab_size=1000, model_max_length=512)
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(**ENCODER_SHAPES["sts"][shape], pad_token_id=1), add_pooling_layer=False)
    return SentenceEncoder(encoder, tokenizer, max_seq_length=PAPER_LEN["sts"]).to(device)


def sts_micro_batches(b: int, seed: int = 0) -> list[Any]:
    """What the STS steps receive: the released schedule (``loss.joint=alternate``) — ``b`` pairs for the MSE
    objective (optimizer 0), then ``b`` sentences for InfoNCE with the MoCo queue (optimizer 1)."""
    from raycl.training.task import Batch

    rng, vocab = random.Random(seed), words()
    pairs = [(sentence(rng, vocab, 6, 40), sentence(rng, vocab, 6, 40), rng.random()) for _ in range(b)]
    sentences = [s for a, c, _ in pairs for s in (a, c)][:b]
    return [Batch(("mse", pairs, [])), Batch(("con", [], sentences), optimizer=1)]


def sts_case(model: Any, b: int, args: Any, device: torch.device) -> Case:
    from raycl.config.tasks.sts import StsConfig
    from raycl.memory.moco import MoCoKeyEncoder
    from raycl.recipes.sts.worker import StsState, StsTask
    from raycl.training.optim import adamw_no_decay as adamw

    cfg = StsConfig()
    moco = MoCoKeyEncoder(model, dim=model.hidden_size, queue_size=cfg.moco.queue_size, m=cfg.moco.m).to(device)
    opts = [adamw(model, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay) for _ in range(2)]
    st = StsState(model, opts, [None, None], {"stage": 0, "started": True}, {"moco": moco})
    # tokens: both sides of the pairs, both SimCSE views of the sentences (the keys pass has no gradient)
    return Case(StsTask(cfg), st, sts_micro_batches(b), 4 * b * PAPER_LEN["sts"], b)


# ---------------------------------------------------------------------------------------------- coherence
def coherence_model(shape: str, device: torch.device, tmp: Path) -> Any:
    """XLNet-base's shape, a local BPE with XLNet's special ids, the paper's 600 text tokens + <sep><cls>."""
    from transformers import XLNetConfig, XLNetModel

    from raycl.models.coherence import CoherenceScorer
    from raycl.models.tokenizer import XLNET, train_bpe_tokenizer

    # the step truncates each text to 600 ids itself: no length warning for the long documents
    tokenizer = train_bpe_tokenizer(
        words(), tmp / "coh-tok", vocab_size=1000, model_max_length=10**6, layout=XLNET
    )
    torch.manual_seed(0)
    encoder = XLNetModel(XLNetConfig(**ENCODER_SHAPES["coherence"][shape]))
    return CoherenceScorer(encoder, tokenizer, max_len=PAPER_LEN["coherence"]).to(device)


def coherence_micro_batches(b: int, negatives: int, seed: int = 0) -> list[Any]:
    """What the coherence step receives: ``b`` documents (longer than 600 tokens) and ``negatives`` sentence
    permutations of each."""
    from raycl.data.coherence import CoherenceItem
    from raycl.training.task import Batch

    rng, vocab = random.Random(seed), words()
    items, negs = [], []
    for i in range(b):
        doc = tuple(sentence(rng, vocab, 10, 25) for _ in range(30))
        perms = [tuple(rng.sample(doc, len(doc))) for _ in range(negatives)]
        items.append(CoherenceItem(f"d{i}", doc, tuple(perms)))
        negs.append(perms)
    return [Batch((items, negs, random.Random(seed)))]  # the generator of the momentum positives' slices


def coherence_case(model: Any, b: int, args: Any, device: torch.device) -> Case:
    from raycl.config.tasks.coherence import CoherenceConfig
    from raycl.memory.negative_queue import NegativeQueue
    from raycl.models.coherence import MomentumEncoder
    from raycl.recipes.coherence.worker import CoherenceState, CoherenceTask
    from raycl.training.state import CheckpointedRandom

    cfg = CoherenceConfig()  # the full model: λ·L_c + (1 − λ)·L_m, queue 1000, 5 negatives
    n = cfg.mining.num_negs
    extras = {
        "queue": NegativeQueue(model.encoder.config.hidden_size, size=cfg.momentum.queue_size, num_negs=n).to(
            device
        ),
        "momentum": MomentumEncoder(model),
        "prefix_rng": CheckpointedRandom(0),
    }
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    st = CoherenceState(model, [opt], [None], {"done": 0}, extras)
    tokens = b * (1 + n) * (PAPER_LEN["coherence"] + 2)
    return Case(CoherenceTask(cfg, ""), st, coherence_micro_batches(b, n), tokens, b)


# ---------------------------------------------------------------------------------------------- the recipes
def collated(case: Case, device: torch.device) -> Case:
    """The case's batches collated by its task and on ``device``: what the loop's prefetcher hands a step."""
    from raycl.training.prefetch import pinned, to_device

    ready = [
        dataclasses.replace(b, data=to_device(pinned(case.task.collate(case.state, b.data), device), device))
        for b in case.batches
    ]
    return dataclasses.replace(case, batches=ready)


class Recipe:
    """A recipe's model, built once (``shape``), and its step at any batch."""

    def __init__(self, name: str, shape: str, device: torch.device, args: Any) -> None:
        self.name, self.shape, self.device, self.args = name, shape, device, args
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-{name}-")
        tmp = Path(self._tmp.name)
        self.tokenizer = None
        if name == "gec":
            self.model = gec_model(shape, device)
        elif name == "idiom":
            self.model, self.tokenizer = idiom_model(shape, device, tmp)
        elif name == "sts":
            self.model = sts_model(shape, device, tmp)
        else:
            self.model = coherence_model(shape, device, tmp)

    def case(self, b: int) -> Case:
        if self.name == "gec":
            case = gec_case(self.model, b, self.args, self.device)
        elif self.name == "idiom":
            case = idiom_case(self.model, self.tokenizer, b, self.args, self.device)
        elif self.name == "sts":
            case = sts_case(self.model, b, self.args, self.device)
        else:
            case = coherence_case(self.model, b, self.args, self.device)
        return collated(case, self.device)

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
