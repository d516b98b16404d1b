"""The Twenty Questions knowledge base: objects, yes/no attributes, and the oracle's phrasings.

The data is ``knowledge.txt`` next to this module (hand-curated; its header
documents the format). :func:`load_knowledge` parses and validates it:
every object has a distinct attribute vector (so questions alone can single
out any object), names and phrasings are unique after normalisation.

The oracle is :meth:`Knowledge.attribute_of`: a question is normalised
(:func:`normalise`: lower case, punctuation dropped, spaces collapsed) and
looked up among the documented phrasings; anything else is unknown. A
question "Is it a <object>?" naming a known object is a guess
(:meth:`Knowledge.object_named`).

:func:`best_question` is the greedy information-gain choice the exact expert
makes: the attribute whose yes/no split of the remaining candidates has the
highest entropy (a deterministic answer's information gain is exactly that).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KNOWLEDGE_PATH = Path(__file__).with_name("knowledge.txt")
_NON_WORD = re.compile(r"[^a-z0-9]+")
_GUESS = re.compile(r"^(?:is it|is this|are you thinking of|it is|its)\s+(?:an?\s+|the\s+|some\s+)?(.+)$")


def normalise(text: str) -> str:
    """Lower case, apostrophes and other punctuation dropped, whitespace collapsed.

    >>> normalise("  Is it MAN-MADE?? ")
    'is it man made'
    """
    return " ".join(_NON_WORD.sub(" ", text.lower().replace("\u2019", "'").replace("'", "")).split())


def object_key(name: str) -> str:
    """The normalised form of an object name, a leading article dropped (``"a Dog"`` -> ``"dog"``)."""
    key = normalise(name)
    for article in ("a ", "an ", "the ", "some "):
        if key.startswith(article):
            return key[len(article) :]
    return key


@dataclass(frozen=True)
class Attribute:
    """A yes/no attribute: its id and the question phrasings the oracle understands."""

    id: str
    phrasings: tuple[str, ...]


@dataclass(frozen=True)
class Knowledge:
    """The objects and attributes (see the module docstring)."""

    attributes: tuple[Attribute, ...]
    objects: tuple[str, ...]  # canonical names
    aliases: tuple[tuple[str, ...], ...]  # per object, its names (canonical first)
    truth: tuple[frozenset[str], ...]  # per object, the ids of its true attributes

    def __post_init__(self) -> None:
        phrase_map: dict[str, str] = {}
        for attr in self.attributes:
            for phrasing in attr.phrasings:
                phrase_map[normalise(phrasing)] = attr.id
        names = {object_key(n): i for i, names in enumerate(self.aliases) for n in names}
        object.__setattr__(self, "_phrases", phrase_map)
        object.__setattr__(self, "_names", names)

    @property
    def attribute_ids(self) -> tuple[str, ...]:
        """Attribute ids in file order."""
        return tuple(a.id for a in self.attributes)

    def attribute(self, attr_id: str) -> Attribute:
        """The attribute with this id."""
        for attr in self.attributes:
            if attr.id == attr_id:
                return attr
        raise KeyError(f"Expected an attribute id among {self.attribute_ids}, got {attr_id!r}")

    def attribute_of(self, question: str) -> str | None:
        """The attribute a question asks about, or ``None`` when it matches no documented phrasing."""
        return self._phrases.get(normalise(question))  # type: ignore[attr-defined]

    def object_named(self, name: str) -> int | None:
        """The index of the object called ``name`` (any alias, article and case ignored), else ``None``."""
        return self._names.get(object_key(name))  # type: ignore[attr-defined]

    def guessed_object(self, question: str) -> int | None:
        """If the question is "Is it a <known object>?", that object's index."""
        match = _GUESS.match(normalise(question))
        return None if match is None else self.object_named(match.group(1))

    def answer(self, index: int, attr_id: str) -> bool:
        """Whether attribute ``attr_id`` is true of object ``index``."""
        return attr_id in self.truth[index]

    def privileged(self, index: int) -> str:
        """The hidden object and its attributes, for the critic."""
        yes = [a for a in self.attribute_ids if a in self.truth[index]]
        return f"Hidden object: {self.objects[index]}. Yes to: {', '.join(yes) or '(nothing)'}; no to every other attribute."


def parse_knowledge(text: str, *, source: str = "knowledge") -> Knowledge:
    """Parse the knowledge-file format (see ``knowledge.txt``); errors name the line."""
    attributes: list[Attribute] = []
    objects: list[tuple[str, ...]] = []
    truth: list[frozenset[str]] = []
    seen_phrasings: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        head, sep, body = line.partition(":")
        if not sep:
            raise ValueError(f"{where}: Expected `name: attributes` or `attr id: phrasing | ...`, got {line!r}")
        if head.startswith("attr "):
            attr_id = head[5:].strip()
            phrasings = tuple(p.strip() for p in body.split("|") if p.strip())
            if not re.fullmatch(r"[a-z_]+", attr_id) or not phrasings:
                raise ValueError(f"{where}: Expected `attr <lowercase_id>: <phrasing> | ...`, got {line!r}")
            for p in phrasings:
                other = seen_phrasings.setdefault(normalise(p), attr_id)
                if other != attr_id:
                    raise ValueError(f"{where}: Expected each phrasing to belong to one attribute, got {p!r} "
                                     f"for both {other} and {attr_id}")
            attributes.append(Attribute(attr_id, phrasings))
            continue
        names = tuple(n.strip() for n in head.split("/") if n.strip())
        ids = body.split()
        known = {a.id for a in attributes}
        unknown = sorted(set(ids) - known)
        if not names or unknown:
            raise ValueError(f"{where}: Expected an object name and attribute ids among the `attr` lines, "
                             f"got names {names} and unknown ids {unknown}")
        objects.append(names)
        truth.append(frozenset(ids))
    kb = Knowledge(tuple(attributes), tuple(n[0] for n in objects), tuple(objects), tuple(truth))
    check_knowledge(kb)
    return kb


def check_knowledge(kb: Knowledge) -> None:
    """Raise unless names are unique and every object's attribute vector is distinct."""
    seen: dict[str, str] = {}
    for names in kb.aliases:
        for name in names:
            other = seen.setdefault(object_key(name), names[0])
            if other != names[0]:
                raise ValueError(f"Expected unique object names, got {name!r} for both {other} and {names[0]}")
    by_vector: dict[frozenset[str], str] = {}
    for name, true in zip(kb.objects, kb.truth):
        other = by_vector.setdefault(true, name)
        if other != name:
            raise ValueError(f"Expected every object to differ in some attribute, got {other!r} and {name!r} alike")


@cache
def load_knowledge(path: str | None = None) -> Knowledge:
    """The shipped knowledge base (or the file at ``path``), parsed once per process."""
    file = Path(path) if path is not None else KNOWLEDGE_PATH
    return parse_knowledge(file.read_text(encoding="utf-8"), source=file.name)


def split_entropy(kb: Knowledge, candidates: Sequence[int], attr_id: str) -> float:
    """Entropy (bits) of the yes/no answer to ``attr_id`` over ``candidates`` (uniform prior)."""
    n = len(candidates)
    yes = sum(attr_id in kb.truth[i] for i in candidates)
    if yes in (0, n):
        return 0.0
    p = yes / n
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def best_question(kb: Knowledge, candidates: Sequence[int], asked: Iterable[str] = ()) -> str | None:
    """The not-yet-asked attribute with the highest information gain (file order breaks ties), or ``None``."""
    done = set(asked)
    best, best_gain = None, 0.0
    for attr_id in kb.attribute_ids:
        if attr_id in done:
            continue
        gain = split_entropy(kb, candidates, attr_id)
        if gain > best_gain + 1e-12:
            best, best_gain = attr_id, gain
    return best


def filter_candidates(kb: Knowledge, candidates: Iterable[int], attr_id: str, answer: bool) -> list[int]:
    """The candidates whose ``attr_id`` equals ``answer``."""
    return [i for i in candidates if (attr_id in kb.truth[i]) == answer]
