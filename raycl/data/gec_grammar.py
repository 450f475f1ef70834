"""The grammar and vocabulary behind the synthetic GEC corpus (:mod:`raycl.data.gec_corpus`).

:func:`sentence` returns a clean, spaCy-tokenised English sentence as a list of :class:`Tok`; each token
carries what the error injector needs: its kind (which error it can host) and the wrong forms a learner
would write in its place (``alts``). Everything random goes through the caller's ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

# --- vocabulary: "word" for regular forms, "word:irregular" otherwise --------------------------------------
_PEOPLE = (
    "teacher student doctor nurse farmer driver artist writer singer player baker pilot lawyer engineer "
    "manager neighbour visitor tourist child:children man:men woman:women person:people friend brother "
    "sister cousin uncle aunt boy girl baby king queen soldier chef waiter scientist actor dancer "
    "customer passenger journalist officer guest cat dog horse bird rabbit mouse:mice fox monkey"
)
_THINGS = (
    "book car letter bag box cup bottle chair table door window key phone computer camera picture map "
    "ticket bicycle shirt jacket hat shoe umbrella ball toy lamp clock bed desk plate knife:knives glass "
    "newspaper magazine song film present cake sandwich apple orange flower tree bus train boat house "
    "message email photo painting guitar piano watch wallet pencil notebook bridge tomato:tomatoes "
    "potato:potatoes dress coat basket bowl"
)
_PLACES = (
    "park station library kitchen garden office market river school hospital museum beach city village "
    "street shop restaurant hotel airport church cinema factory farm stadium castle forest"
)
_EVENTS = "meeting lesson holiday storm game concert party trip match exam class wedding"
_NAMES = "John Mary Anna David Sarah Peter Lisa Tom Emma Daniel Maria Paul Laura James Sophie Ben Kate Nina"
_TRANSITIVE = (
    "buy:bought read:read write:wrote:written clean open carry find:found build:built visit need want like "
    "sell:sold paint repair watch bring:brought take:took:taken make:made see:saw:seen love help call follow "
    "cook wash fix draw:drew:drawn choose:chose:chosen steal:stole:stolen lose:lost keep:kept send:sent "
    "break:broke:broken hide:hid:hidden forget:forgot:forgotten drive:drove:driven catch:caught teach:taught "
    "close push pull drop order deliver borrow collect describe explain enjoy miss remember"
)
_INTRANSITIVE = (
    "sleep:slept walk arrive wait live laugh run:ran:run swim:swam:swum sit:sat stay smile dance cry shout "
    "jump rest work play travel:travelled sing:sang:sung fall:fell:fallen complain stop"
)
_PREPOSITIONAL = (
    "listen/to look/at depend/on wait/for talk/about believe/in agree/with belong/to think:thought/about "
    "care/about worry/about point/at apply/for ask/for pay:paid/for search/for dream/about"
)
_CONTROL = "want need try hope plan decide forget:forgot:forgotten promise refuse learn"
_ADJECTIVES = (
    "old new big small red blue green white black young happy sad quiet busy expensive cheap beautiful dark "
    "bright dirty heavy warm cold hot tall short long strong tired famous friendly angry hungry lazy polite "
    "careful brave clever strange modern empty noisy safe nervous proud simple wooden broken"
)
_FREQ_ADVERBS = "always often usually never sometimes rarely"
_MANNER_ADVERBS = "quickly slowly carefully quietly happily loudly badly easily"
_DEGREE = "very quite really too"
_PREP_ALTS = {
    "in": ("on", "at"),
    "on": ("in", "at"),
    "at": ("in", "on"),
    "to": ("for", "at"),
    "for": ("to", "of"),
    "with": ("by", "to"),
    "about": ("of", "on"),
    "near": ("by", "at"),
    "under": ("on", "in"),
    "behind": ("after", "in"),
    "after": ("since", "from"),
    "before": ("until", "at"),
    "during": ("in", "on"),
    "from": ("of", "by"),
    "of": ("for", "from"),
    "outside": ("out", "in"),
}
_PLACE_PREPS = ("in", "in", "at", "near", "behind", "outside")
_EVENT_PREPS = ("after", "before", "during")
_DOUBLE = {"stop", "plan", "shop", "drop", "chat", "jog", "travel", "run", "swim", "sit", "get", "forget"}
_AN_EXCEPTIONS = {"useful", "university", "unique", "european", "one", "uniform"}


@dataclass(frozen=True)
class Verb:
    base: str
    s3: str
    past: str
    part: str
    ing: str
    prep: str = ""  # the preposition of a prepositional verb ("listen to")


class Tok:
    """One clean token: ``kind`` says which error it can host, ``alts`` the wrong forms a learner writes."""

    __slots__ = ("text", "kind", "alts", "droppable", "bare")

    def __init__(
        self,
        text: str,
        kind: str = "w",
        alts: tuple[str, ...] = (),
        *,
        droppable: bool = False,
        bare: bool = False,
    ) -> None:
        self.text = text
        self.kind = kind  # det prep sva form noun adj adv verb name comma end w
        self.alts = alts
        self.droppable = droppable  # an article whose omission is an error (M:DET)
        self.bare = bare  # starts a bare noun phrase, where an inserted article is an error (U:DET)


T = TypeVar("T")


def pick(rng: random.Random, seq: Sequence[T]) -> T:
    """``rng.choice(seq)`` at half the cost (the corpus draws ~20 per sentence)."""
    return seq[int(rng.random() * len(seq))]


def an(word: str) -> str:
    """The indefinite article for ``word``."""
    return "an" if word[0] in "aeiou" and word not in _AN_EXCEPTIONS else "a"


def _sibilant(w: str) -> bool:
    return w.endswith(("s", "x", "z", "ch", "sh"))


def _plural(w: str) -> str:
    if _sibilant(w):
        return w + "es"
    return w[:-1] + "ies" if w.endswith("y") and w[-2] not in "aeiou" else w + "s"


def _nouns(spec: str) -> list[tuple[str, str]]:
    return [(w.split(":")[0], w.split(":")[1] if ":" in w else _plural(w)) for w in spec.split()]


def _verb(entry: str) -> Verb:
    forms, _, prep = entry.partition("/")
    base, *irregular = forms.split(":")
    stem = base + base[-1] if base in _DOUBLE else base
    s3 = base + "es" if _sibilant(base) or base.endswith("o") else _plural(base)
    if base.endswith("e"):
        ing, past = (base if base.endswith("ee") else base[:-1]) + "ing", base + "d"
    else:
        ing = stem + "ing"
        past = base[:-1] + "ied" if base.endswith("y") and base[-2] not in "aeiou" else stem + "ed"
    past = irregular[0] if irregular else past
    part = irregular[1] if len(irregular) > 1 else past
    return Verb(base, s3, past, part, ing, prep)


PEOPLE, THINGS = _nouns(_PEOPLE), _nouns(_THINGS)
PLACES, EVENTS = _nouns(_PLACES), _nouns(_EVENTS)
NAMES = _NAMES.split()
TRANSITIVE = [_verb(e) for e in _TRANSITIVE.split()]
INTRANSITIVE = [_verb(e) for e in _INTRANSITIVE.split()]
PREPOSITIONAL = [_verb(e) for e in _PREPOSITIONAL.split()]
CONTROL = [_verb(e) for e in _CONTROL.split()]
ADJECTIVES, FREQ_ADVERBS = _ADJECTIVES.split(), _FREQ_ADVERBS.split()
MANNER_ADVERBS, DEGREE = _MANNER_ADVERBS.split(), _DEGREE.split()


# --- grammar ---------------------------------------------------------------------------------------------
_BE = {"1sg": "am", "3sg": "is", "pl": "are"}
_WAS = {"1sg": "was", "3sg": "was", "pl": "were"}
_OTHER = {
    "am": "is",
    "is": "are",
    "are": "is",
    "was": "were",
    "were": "was",
    "has": "have",
    "have": "has",
    "does": "do",
    "do": "does",
}
_PRONOUNS = (("I", "1sg"), ("you", "pl"), ("he", "3sg"), ("she", "3sg"), ("we", "pl"), ("they", "pl"))
_OBJECT_PRONOUNS = ("me", "him", "her", "us", "them", "you")
_SG_DETS = ("the",) * 5 + ("a",) * 4 + ("this", "that", "my", "your", "his", "her", "our", "their", "every")
_PL_DETS = ("the",) * 4 + ("", "") * 2 + ("these", "those", "some", "many", "my", "their", "two", "several")
# Replacements a tagger still reads as determiners (DT/PRP$), so ERRANT calls them R:DET; "many", "several"
# and "two" are tagged JJ/CD, so they host no determiner error.
_DET_ALTS = {
    "this": ("these",),
    "that": ("those",),
    "every": ("all", "these"),
    "these": ("this",),
    "those": ("that",),
    "some": ("a",),
}
_QUANTIFIERS = {"many", "several", "two"}
_TENSES = (
    ("present",) * 6
    + ("past",) * 5
    + (
        "prog",
        "prog",
        "perfect",
        "perfect",
        "modal",
        "modal",
        "modal",
        "neg_present",
        "neg_past",
        "past_prog",
        "neg_modal",
    )
)
_MODALS = ("can", "will", "should", "must", "might", "could", "would")
_NEG_MODALS = (("ca", "future"), ("wo", "future"), ("should", "any"), ("could", "any"))
_TIMES = {
    "past": ("yesterday", "last week", "last year", "last night", "two days ago"),
    "present": ("every day", "every morning", "on Sundays", "at weekends"),
    "future": ("tomorrow", "next week", "next year", "soon"),
    "now": ("now", "right now", "at the moment"),
}
_CONJ = ("because", "when", "although", "after", "before", "if", "while", "since")


def _alts(text: str, *candidates: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c for c in candidates if c != text))


def _wrong_article(word: str) -> str:
    return "a" if an(word) == "an" else "an"


def _det(rng: random.Random, plural: bool, following: str) -> Tok | None:
    word = pick(rng, _PL_DETS if plural else _SG_DETS)
    if not word:
        return None
    if word in _QUANTIFIERS:
        return Tok(word)
    if plural:
        return Tok(word, "det", _DET_ALTS.get(word, ("a",)))
    if word in ("the", "a"):
        word = an(following) if word == "a" else word
        return Tok(word, "det", (_wrong_article(following), "these"), droppable=True)
    return Tok(word, "det", _DET_ALTS.get(word, ("these", "those")))


def noun_phrase(
    rng: random.Random, nouns: list[tuple[str, str]], *, plural_p: float = 0.35, adj_p: float = 0.3
) -> tuple[list[Tok], str]:
    """Determiner (or none, for plurals), optional adjective, noun; and the agreement it asks of a verb."""
    sg, pl = pick(rng, nouns)
    plural = rng.random() < plural_p
    noun = Tok(pl if plural else sg, "noun", (sg if plural else pl,))
    mods = []
    if rng.random() < adj_p:
        mods = [Tok(pick(rng, ("very", "really")))] if rng.random() < 0.15 else []
        mods.append(Tok(pick(rng, ADJECTIVES), "adj"))
    det = _det(rng, plural, (mods or [noun])[0].text)
    toks = ([det] if det else []) + mods + [noun]
    toks[0].bare = det is None
    return toks, "pl" if plural else "3sg"


def _place(rng: random.Random) -> list[Tok]:
    prep = pick(rng, _PLACE_PREPS)
    return [Tok(prep, "prep", _PREP_ALTS[prep])] + noun_phrase(rng, PLACES, plural_p=0.1, adj_p=0.2)[0]


def _time(rng: random.Random, key: str) -> list[Tok]:
    if key in _TIMES and rng.random() < 0.6:
        return [Tok(w, "w") for w in pick(rng, _TIMES[key]).split()]
    prep = pick(rng, _EVENT_PREPS)
    return [Tok(prep, "prep", _PREP_ALTS[prep])] + noun_phrase(rng, EVENTS, plural_p=0.0, adj_p=0.1)[0]


def _freq(rng: random.Random) -> list[Tok]:
    return [Tok(pick(rng, FREQ_ADVERBS), "adv")] if rng.random() < 0.25 else []


def verb_group(rng: random.Random, v: Verb, agr: str, tense: str) -> tuple[list[Tok], str]:
    """The finite verb group of ``v`` agreeing with ``agr``; and which time adverbials fit the tense."""
    s3 = agr == "3sg"
    if tense == "present":
        main, wrong = (v.s3, v.base) if s3 else (v.base, v.s3)
        return _freq(rng) + [Tok(main, "sva", (wrong,))], "present"
    if tense == "past":
        return _freq(rng) + [Tok(v.past, "verb")], "past"
    if tense in ("prog", "past_prog"):
        aux = (_BE if tense == "prog" else _WAS)[agr]
        form = Tok(v.ing, "form", _alts(v.ing, v.base, v.s3 if tense == "prog" else v.past))
        return [Tok(aux, "sva", (_OTHER[aux],)), form], "now" if tense == "prog" else "past"
    if tense == "perfect":
        aux = "has" if s3 else "have"
        return [Tok(aux, "sva", (_OTHER[aux],)), Tok(v.part, "form", _alts(v.part, v.base, v.ing, v.past))], "any"
    if tense == "neg_present":
        aux = "does" if s3 else "do"
        return [Tok(aux, "sva", (_OTHER[aux],)), Tok("n't"), Tok(v.base, "form", (v.s3, v.ing))], "present"
    if tense == "neg_past":
        return [Tok("did"), Tok("n't"), Tok(v.base, "form", _alts(v.base, v.past, v.ing))], "past"
    if tense == "neg_modal":
        modal, key = pick(rng, _NEG_MODALS)
        return [Tok(modal), Tok("n't"), Tok(v.base, "form", (v.s3, v.ing))], key
    modal = pick(rng, _MODALS)
    form = Tok(v.base, "form", _alts(v.base, v.s3, v.ing, v.past))
    return [Tok(modal), form], "future" if modal == "will" else "any"


def _object(rng: random.Random) -> list[Tok]:
    r = rng.random()
    if r < 0.1:
        return [Tok(pick(rng, _OBJECT_PRONOUNS))]
    if r < 0.2:
        return [Tok(pick(rng, NAMES), "name", bare=True)]
    return noun_phrase(rng, THINGS if r < 0.8 else PEOPLE)[0]


def _complement(rng: random.Random, v: Verb, kind: str) -> list[Tok]:
    if kind == "prepositional":
        return [Tok(v.prep, "prep", _PREP_ALTS[v.prep])] + _object(rng)
    out = _object(rng) if kind == "transitive" else []
    if rng.random() < (0.15 if kind == "transitive" else 0.3):
        out.append(Tok(pick(rng, MANNER_ADVERBS), "adv_manner"))
    if rng.random() < (0.3 if kind == "transitive" else 0.6):
        out += _place(rng)
    return out


def _verb_of(rng: random.Random) -> tuple[Verb, str]:
    kind = pick(rng, ("transitive", "transitive", "intransitive", "prepositional"))
    pool = {"transitive": TRANSITIVE, "intransitive": INTRANSITIVE, "prepositional": PREPOSITIONAL}[kind]
    return pick(rng, pool), kind


def _copula(rng: random.Random, agr: str) -> list[Tok]:
    tense = pick(rng, ("present", "present", "past", "modal"))
    if tense == "modal":
        be = [Tok(pick(rng, ("will", "might", "should"))), Tok("be", "form", ("is", "being"))]
    else:
        aux = (_BE if tense == "present" else _WAS)[agr]
        be = [Tok(aux, "sva", (_OTHER[aux],))]
    if rng.random() < 0.3:
        return be + _place(rng)
    degree = [Tok(pick(rng, DEGREE))] if rng.random() < 0.3 else []
    return be + degree + [Tok(pick(rng, ADJECTIVES), "adj")]


def predicate(rng: random.Random, agr: str, *, time_p: float = 0.3) -> list[Tok]:
    """A verb phrase agreeing with ``agr``: copula, plain verb, or control verb + to-infinitive."""
    if rng.random() < 0.15:
        return _copula(rng, agr)
    v, kind = _verb_of(rng)
    tense = pick(rng, _TENSES)
    if rng.random() < 0.2:
        group, key = verb_group(rng, pick(rng, CONTROL), agr, tense)
        group += [Tok("to"), Tok(v.base, "form", _alts(v.base, v.ing, v.s3, v.past))]
    else:
        group, key = verb_group(rng, v, agr, tense)
    out = group + _complement(rng, v, kind)
    return out + _time(rng, key) if rng.random() < time_p else out


def subject(rng: random.Random) -> tuple[list[Tok], str]:
    """A pronoun, a name, or a noun phrase (sometimes with a relative clause); and its agreement."""
    r = rng.random()
    if r < 0.25:
        pronoun, agr = pick(rng, _PRONOUNS)
        return [Tok(pronoun)], agr
    if r < 0.4:
        return [Tok(pick(rng, NAMES), "name", bare=True)], "3sg"
    toks, agr = noun_phrase(rng, PEOPLE if r < 0.85 else THINGS)
    if rng.random() < 0.12:
        v = pick(rng, INTRANSITIVE)
        group, _ = verb_group(rng, v, agr, pick(rng, ("present", "past")))
        toks += [Tok("who" if r < 0.85 else "that")] + group + _complement(rng, v, "intransitive")
    return toks, agr


def clause(rng: random.Random, *, time_p: float = 0.3) -> list[Tok]:
    subj, agr = subject(rng)
    return subj + predicate(rng, agr, time_p=time_p)


def _body(rng: random.Random) -> list[Tok]:
    r = rng.random()
    if r < 0.55:
        return clause(rng)
    conj = Tok(pick(rng, _CONJ))
    if r < 0.75:  # a fronted subordinate clause takes a comma
        return [conj] + clause(rng, time_p=0.1) + [Tok(",", "comma")] + clause(rng, time_p=0.1)
    if r < 0.88:
        comma = [Tok(",", "comma")] if conj.text in ("although", "while") else []
        return clause(rng, time_p=0.1) + comma + [conj] + clause(rng, time_p=0.1)
    coord = Tok(pick(rng, ("and", "but", "so")))
    return clause(rng, time_p=0.1) + [Tok(",", "comma"), coord] + clause(rng, time_p=0.1)


def sentence(rng: random.Random, *, min_len: int = 6, max_len: int = 25) -> list[Tok]:
    """A clean sentence of ``min_len``..``max_len`` tokens, capitalised, ending in a full stop."""
    while True:
        toks = _body(rng) + [Tok(".", "end")]
        if min_len <= len(toks) <= max_len:
            first = toks[0]
            first.text = first.text[0].upper() + first.text[1:]
            return toks
