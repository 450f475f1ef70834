"""Built-in coherence corpus: short English stories whose sentence order matters, and test sets built on them.

Each document is a story about one person. The first sentence introduces them by name and role ("Maria was
a baker who lived in a quiet village."); later sentences refer to them by pronoun, objects and people are
introduced with an indefinite NP ("an old radio", "a farmer named Leo") before the definite one ("the
radio", "Leo"), episodes chain cause and effect ("Because of this, ...", "As a result, ...") and are linked
by temporal connectives ("First, ...", "Then, ...", "The next day, ..."), and the last sentence starts with
"Finally" or "In the end". A permutation breaks these cues, so a model can learn to tell the order apart.
Lengths are uniform in 4-25 sentences; no sentence repeats inside a document and no document repeats.

:func:`write_builtin_corpus` writes what the coherence recipe and ``raycl.eval coherence`` read:
``train.txt`` (documents), ``dev.pkl`` (training layout, 5 permutations per item), ``test.pkl`` (pairwise
permuted test set), ``intrusion_test.pkl`` (INSteD-style: one sentence, never the first, replaced by a
sentence of another story), and ``lmvlm.pkl`` + ``lmvlm_annotations.pkl`` (LMvLM-style: two continuations
of one prompt, the coherent one on either side, judged by 3 simulated annotators). Deterministic by seed.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from raycl.data.coherence import (
    CoherenceItem,
    Document,
    build_permuted_set,
    sample_permutations,
    write_documents,
    write_pairs_pickle,
)
from raycl.files import write_atomic

DEFAULT_SIZES = {"train": 400, "dev": 40, "test": 60, "intrusion": 60, "lmvlm": 60}  # documents per split
TEST_COPIES = 4  # permutations per test document (the WSJ test set has about 20)
ANNOTATOR_ACCURACY = 0.95  # each simulated LMvLM annotator picks the coherent side with this probability
MIN_LEN, MAX_LEN = 4, 25

_FEMALE = ["Maria", "Anna", "Lucy", "Emma", "Sara", "Nora", "Julia", "Clara", "Rosa", "Alice"]
_MALE = ["Tom", "David", "Peter", "Sam", "Jack", "Leo", "Ben", "Max", "Paul", "Oscar"]
_ROLES = [
    "baker",
    "farmer",
    "teacher",
    "doctor",
    "student",
    "fisherman",
    "painter",
    "carpenter",
    "nurse",
    "musician",
    "gardener",
    "writer",
]
# (where the person lives, the area that weather and floods hit)
_PLACES = [
    ("a small town by the sea", "town"),
    ("a quiet village in the hills", "village"),
    ("a busy city", "city"),
    ("a farm near the forest", "farm"),
    ("an old house by the river", "valley"),
    ("a cabin in the mountains", "mountains"),
]
_INTROS = [
    "{Name} was {a_role} who lived in {place}.",
    "There was once {a_role} named {Name} in {place}.",
    "{Name}, a young {role}, had just moved to {place}.",
]
_FIRST = ["First,", "One morning,", "At the start of the spring,"]
_NEXT = ["Then,", "After that,", "Later,", "The next day,", "A week later,", "Soon after,"]
_ENDINGS = [
    "Finally, {Name} was happy with {poss} new home.",
    "In the end, {Name} wrote about all of it in {poss} diary.",
    "Finally, {S} went to bed early, tired but glad.",
    "In the end, {Name} decided to stay in the {area} for good.",
]
# (object, adjectives, what is wrong with it, what the person does with it once it works)
_OBJECTS = [
    ("bicycle", ["red", "old", "blue"], "had a flat tyre", "rode the bicycle to the market every day"),
    ("lamp", ["brass", "small", "old"], "did not turn on", "read by the light of the lamp every evening"),
    ("radio", ["old", "tiny", "green"], "made a strange buzzing noise", "listened to the news on the radio"),
    ("boat", ["wooden", "small", "white"], "had a hole in its side", "sailed the boat across the lake"),
    ("clock", ["tall", "antique", "golden"], "had stopped at midnight", "hung the clock in the kitchen"),
    ("camera", ["old", "black", "cheap"], "had a cracked lens", "took photos of the hills with the camera"),
    ("piano", ["old", "dusty", "upright"], "was badly out of tune", "played the piano for the neighbours"),
    ("tent", ["green", "large", "old"], "had a torn roof", "camped in the tent by the lake"),
    ("kite", ["yellow", "paper", "huge"], "had a broken frame", "flew the kite on the windy hill"),
    ("oven", ["iron", "old", "second-hand"], "did not get hot", "baked bread in the oven"),
    ("guitar", ["old", "cheap", "wooden"], "had two broken strings", "played the guitar at the village party"),
    ("car", ["old", "small", "rusty"], "would not start", "drove the car to the coast"),
]
_GOT = ["bought", "found", "borrowed", "was given"]
_HELPERS = ["neighbour", "cousin", "friend", "old classmate"]
_VENUES = ["market", "library", "station", "park", "harbour", "bakery"]
# (what the newcomer needs, how the person helps, what comes of it); {F} = the newcomer's name
_NEEDS = [
    ("a place to stay", "offered {F} the spare room", "{F} stayed for a week and helped in the garden"),
    ("a lost dog", "searched the streets with {F}", "they found the dog asleep near the bridge"),
    ("work", "told {F} about a job at the mill", "{F} started working at the mill the next week"),
    ("a good book", "lent {F} a thick novel", "{F} returned the novel a month later with a thank-you note"),
    ("the way to the museum", "walked with {F} to the museum", "{F} invited {O} to lunch after the visit"),
]
# (event, what it did, what the person had to do, how things recovered)
_EVENTS = [
    (
        "a storm hit the {area}",
        "The storm broke two windows of {poss} house",
        "{S} had to sleep at {poss} sister's house",
        "Later, {S} replaced the broken windows",
    ),
    (
        "heavy snow fell for three days",
        "The snow blocked the only road out of the {area}",
        "{S} could not go to work",
        "When the snow melted, {S} went back to work",
    ),
    (
        "a fire started in an old barn",
        "The fire spread quickly to the fence",
        "{S} called the fire brigade",
        "The firefighters put out the fire before it reached the house",
    ),
    (
        "the river flooded",
        "The water covered the fields around {poss} house",
        "{S} moved the animals to higher ground",
        "After the water went down, {S} cleaned the yard",
    ),
    (
        "a strong wind blew all night",
        "The wind knocked down the old apple tree",
        "{S} cut the tree into firewood",
        "The firewood kept {O} warm all winter",
    ),
]


@dataclass
class _Story:
    """The protagonist's slots and what the story has used so far (nothing is introduced twice)."""

    slots: dict[str, str]
    rng: random.Random
    objects: list[tuple[str, list[str], str, str]]
    friends: list[str]
    needs: list[tuple[str, str, str]]
    events: list[tuple[str, str, str, str]]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _fill(template: str, slots: Mapping[str, str]) -> str:
    return _cap(template.format(**slots))


def _object_episode(story: _Story, conn: str, subject: str) -> list[str]:
    noun, adjs, problem, use = story.objects.pop()
    helper, friend = story.rng.choice(_HELPERS), story.friends.pop()
    s = story.slots
    return [
        f"{conn} {subject} {story.rng.choice(_GOT)} {_a(story.rng.choice(adjs) + ' ' + noun)}.",
        f"The {noun} {problem}.",
        f"Because of this, {s['S']} asked {s['poss']} {helper} {friend} for help.",
        f"{friend} repaired the {noun} in one afternoon.",
        f"After that, {s['S']} {use}.",
    ]


def _meeting_episode(story: _Story, conn: str, subject: str) -> list[str]:
    need, help_, result = story.needs.pop()
    friend, role = story.friends.pop(), story.rng.choice(_ROLES)
    slots = {**story.slots, "F": friend}
    return [
        f"{conn} {subject} met {_a(role)} named {friend} at the {story.rng.choice(_VENUES)}.",
        f"The {role} was looking for {need}.",
        _fill(f"{{S}} wanted to help, so {{S}} {help_}.", slots),
        _fill(f"As a result, {result}.", slots),
    ]


def _event_episode(story: _Story, conn: str, subject: str) -> list[str]:
    event, effect, action, recovery = story.events.pop()
    return [
        _fill(f"{conn} {event}.", story.slots),
        _fill(f"{effect}.", story.slots),
        _fill(f"Because of this, {action}.", story.slots),
        _fill(f"{recovery}.", story.slots),
    ]


_EPISODES = [_object_episode, _meeting_episode, _event_episode]


def _new_story(rng: random.Random) -> _Story:
    female = rng.random() < 0.5
    name = rng.choice(_FEMALE if female else _MALE)
    place, area = rng.choice(_PLACES)
    slots = {
        "Name": name,
        "S": "she" if female else "he",
        "O": "her" if female else "him",
        "poss": "her" if female else "his",
        "place": place,
        "area": area,
    }
    friends = [f for f in _FEMALE + _MALE if f != name]
    return _Story(
        slots,
        rng,
        rng.sample(_OBJECTS, len(_OBJECTS)),
        rng.sample(friends, len(friends)),
        rng.sample(_NEEDS, len(_NEEDS)),
        rng.sample(_EVENTS, len(_EVENTS)),
    )


def _story(rng: random.Random, length: int) -> tuple[str, ...]:
    """One story of exactly ``length`` sentences: intro, episodes (the last one cut to fit), ending."""
    story = _new_story(rng)
    role = rng.choice(_ROLES)
    sentences = [_fill(rng.choice(_INTROS), {**story.slots, "role": role, "a_role": _a(role)})]
    while len(sentences) < length - 1:
        conn = rng.choice(_FIRST if len(sentences) == 1 else _NEXT)
        subject = story.slots["Name"] if rng.random() < 0.3 else story.slots["S"]
        kinds = [k for k, pool in zip(_EPISODES, (story.objects, story.needs, story.events), strict=True) if pool]
        sentences += rng.choice(kinds)(story, conn, subject)[: length - 1 - len(sentences)]
    sentences.append(_fill(rng.choice(_ENDINGS), story.slots))
    return tuple(sentences)


def generate_documents(n: int, *, seed: int, prefix: str = "story") -> list[Document]:
    """``n`` distinct stories of 4-25 sentences (ids ``"<prefix>-<i>"``), deterministic given ``seed``."""
    rng = random.Random(seed)
    docs: list[Document] = []
    seen: set[tuple[str, ...]] = set()
    while len(docs) < n:
        sentences = _story(rng, rng.randint(MIN_LEN, MAX_LEN))
        if sentences not in seen and len(set(sentences)) == len(sentences):
            seen.add(sentences)
            docs.append(Document(f"{prefix}-{len(docs)}", sentences))
    return docs


def _intruder(documents: list[Document], k: int, i: int, *, rng: random.Random) -> str:
    """Sentence ``i`` (or the last) of a random other story that document ``k`` does not already contain."""
    own = set(documents[k].sentences)
    for _ in range(100):
        other = documents[(k + rng.randrange(1, len(documents))) % len(documents)].sentences
        if other[min(i, len(other) - 1)] not in own:
            return other[min(i, len(other) - 1)]
    raise ValueError("no other story offers a different sentence; generate more documents")


def intrusion_pairs(documents: list[Document], *, seed: int, max_sentences: int = 8) -> list[CoherenceItem]:
    """INSteD-style pairs: the first ``max_sentences`` of a story, and the same with one sentence (never the
    first) replaced by a sentence at the same position in another story (or its last one, if shorter)."""
    rng = random.Random(seed)
    items = []
    for k, doc in enumerate(documents):
        pos = doc.sentences[:max_sentences]
        i = rng.randrange(1, len(pos))
        neg = (*pos[:i], _intruder(documents, k, i, rng=rng), *pos[i + 1 :])
        items.append(CoherenceItem(f"{doc.id}#intrusion", pos, (neg,)))
    return items


def lmvlm_pairs(documents: list[Document], *, seed: int) -> tuple[list[CoherenceItem], list[list[str | None]]]:
    """LMvLM-style pairs and 3 annotators' labels (``'0'``: ``pos`` is more coherent, ``'1'``: ``neg``).

    Both sides share the story's first 2-3 sentences (the prompt); one continues with the rest of the story,
    the other with the rest shuffled. Which side is ``pos`` is random, so the labels are mixed, as in LMvLM;
    each annotator names the coherent side with probability :data:`ANNOTATOR_ACCURACY`.
    """
    rng = random.Random(seed)
    items, truth = [], []
    for doc in documents:
        cut = min(rng.randint(2, 3), len(doc.sentences) - 2)
        prompt, rest = doc.sentences[:cut], doc.sentences[cut:]
        perm = sample_permutations(len(rest), 1, rng=rng)[0]
        good, bad = (*prompt, *rest), (*prompt, *(rest[i] for i in perm))
        flip = rng.random() < 0.5
        items.append(CoherenceItem(f"{doc.id}#lmvlm", bad if flip else good, (good if flip else bad,)))
        truth.append("1" if flip else "0")
    coders: list[list[str | None]] = [
        [t if rng.random() < ANNOTATOR_ACCURACY else "10"[int(t)] for t in truth] for _ in range(3)
    ]
    return items, coders


def write_builtin_corpus(
    out_dir: str | Path, *, seed: int = 0, sizes: Mapping[str, int] | None = None
) -> dict[str, Path]:
    """Write the built-in corpus into ``out_dir`` (see the module docstring); returns ``{name: path}``.

    ``sizes`` gives the documents per split (keys of :data:`DEFAULT_SIZES`; missing keys keep the
    default). All splits come from one stream of distinct stories, so no document is in two splits.
    """
    n = {**DEFAULT_SIZES, **(sizes or {})}
    unknown = set(n) - set(DEFAULT_SIZES)
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)}; expected {sorted(DEFAULT_SIZES)}")
    docs = generate_documents(sum(n.values()), seed=seed)
    split: dict[str, list[Document]] = {}
    for name in DEFAULT_SIZES:
        split[name], docs = docs[: n[name]], docs[n[name] :]
    out = Path(out_dir)
    paths = {
        name: out / file
        for name, file in [
            ("train", "train.txt"),
            ("dev", "dev.pkl"),
            ("test", "test.pkl"),
            ("intrusion", "intrusion_test.pkl"),
            ("lmvlm", "lmvlm.pkl"),
            ("lmvlm_annotations", "lmvlm_annotations.pkl"),
        ]
    }
    write_documents(split["train"], paths["train"])
    write_pairs_pickle(build_permuted_set(split["dev"], num_negs=5, copies=1, seed=seed), paths["dev"])
    write_pairs_pickle(build_permuted_set(split["test"], num_negs=1, copies=TEST_COPIES, seed=seed), paths["test"])
    write_pairs_pickle(intrusion_pairs(split["intrusion"], seed=seed), paths["intrusion"])
    lmvlm, coders = lmvlm_pairs(split["lmvlm"], seed=seed)
    write_pairs_pickle(lmvlm, paths["lmvlm"])
    write_atomic(paths["lmvlm_annotations"], pickle.dumps(coders, protocol=3))
    return paths
