"""Offline BABILong-style data: bAbI qa1-qa3 stories hidden in haystack text, answers correct by construction.

A story is simulated in a small world (people move between six rooms, pick up and drop three objects) and
the question is asked about the final world state:
    qa1  single supporting fact   "Where is Mary?"                       the person's last room
    qa2  two supporting facts     "Where is the football?"               the room of the object (carried
                                                                          objects move with their carrier)
    qa3  three supporting facts   "Where was the apple before the kitchen?"  the room the object was in
                                                                              right before it entered it
Names, rooms and objects are those of bAbI, so the BABILong label sets and metric apply unchanged.

The facts are then hidden, in order, at random places of a haystack window ('embedded': the Python
standard library's sources, ASCII only; 'filler': the passkey filler sentences), each on its own line.
Lengths are exact in the given tokenizer's tokens: the context is built from token pieces and decoded
to the record's `input` text (for the byte tokenizer the text re-encodes to the same tokens).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from recurlen.evaluation.tasks.config import GENERATED_MIN_FACTS as MIN_FACTS
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)

PERSONS = ("Mary", "John", "Daniel", "Sandra")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
MOVE = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
GRAB = ("picked up", "got", "grabbed", "took")
DROP = ("dropped", "discarded", "put down", "left")
_MAX_TRIES = 10_000
POOL_TOKENS = 1 << 16


@dataclass
class Story:
    facts: list[str]
    question: str
    answer: str


@dataclass
class World:
    """The state a story describes; answers are read from it, never from the text."""

    person_loc: dict[str, str] = field(default_factory=dict)
    holder: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(OBJECTS))
    history: dict[str, list[str]] = field(default_factory=lambda: {o: [] for o in OBJECTS})
    """Rooms each object has been in, in order (consecutive entries differ)."""

    def _place(self, obj: str, loc: str) -> None:
        if not self.history[obj] or self.history[obj][-1] != loc:
            self.history[obj].append(loc)

    def move(self, person: str, loc: str) -> None:
        self.person_loc[person] = loc
        for obj, who in self.holder.items():
            if who == person:
                self._place(obj, loc)

    def can_grab(self, person: str, obj: str) -> bool:
        here = self.person_loc.get(person)
        return here is not None and self.holder[obj] is None and (not self.history[obj] or
                                                                  self.history[obj][-1] == here)

    def grab(self, person: str, obj: str) -> None:
        assert self.can_grab(person, obj)
        self.holder[obj] = person
        self._place(obj, self.person_loc[person])

    def drop(self, person: str, obj: str) -> None:
        assert self.holder[obj] == person
        self.holder[obj] = None


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def _random_events(rng: np.random.Generator, task: str, num_facts: int) -> tuple[list[str], World]:
    world, facts = World(), []
    for _ in range(num_facts):
        person = _pick(rng, PERSONS)
        choices = ["move"]
        if task != "qa1":
            if any(world.can_grab(person, o) for o in OBJECTS):
                choices += ["grab", "grab"]
            if any(world.holder[o] == person for o in OBJECTS):
                choices += ["drop"]
        kind = _pick(rng, choices)
        if kind == "move":
            here = world.person_loc.get(person)
            loc = _pick(rng, [loc for loc in LOCATIONS if loc != here])
            world.move(person, loc)
            facts.append(f"{person} {_pick(rng, MOVE)} the {loc}.")
        elif kind == "grab":
            obj = _pick(rng, [o for o in OBJECTS if world.can_grab(person, o)])
            world.grab(person, obj)
            facts.append(f"{person} {_pick(rng, GRAB)} the {obj} there.")
        else:
            obj = _pick(rng, [o for o in OBJECTS if world.holder[o] == person])
            world.drop(person, obj)
            facts.append(f"{person} {_pick(rng, DROP)} the {obj} there.")
    return facts, world


def _question(rng: np.random.Generator, task: str, world: World) -> tuple[str, str] | None:
    if task == "qa1":
        people = sorted(world.person_loc)
        if not people:
            return None
        person = _pick(rng, people)
        return f"Where is {person}?", world.person_loc[person]
    if task == "qa2":
        # Two supporting facts: the object was carried from where it was picked up (history of >= 2 rooms).
        carried = [o for o in OBJECTS if len(world.history[o]) >= 2]
        if not carried:
            return None
        obj = _pick(rng, carried)
        return f"Where is the {obj}?", world.history[obj][-1]
    # qa3: a room the object entered exactly once (else "before the kitchen" would be ambiguous).
    options = [(o, i) for o in OBJECTS for i in range(1, len(world.history[o]))
               if world.history[o].count(world.history[o][i]) == 1]
    if not options:
        return None
    obj, i = _pick(rng, options)
    return f"Where was the {obj} before the {world.history[obj][i]}?", world.history[obj][i - 1]


def make_story(rng: np.random.Generator, task: str, *, num_facts: int) -> Story:
    """A random story of num_facts facts with a question whose answer the simulated world gives."""
    if task not in MIN_FACTS:
        raise ValueError(f"the offline BABILong generator has no task {task!r}; allowed: {sorted(MIN_FACTS)}")
    if num_facts < MIN_FACTS[task]:
        raise ValueError(f"task {task} needs num_facts >= {MIN_FACTS[task]}; got {num_facts}")
    for _ in range(_MAX_TRIES):
        facts, world = _random_events(rng, task, num_facts)
        qa = _question(rng, task, world)
        if qa is not None:
            return Story(facts=facts, question=qa[0], answer=qa[1])
    raise ValueError(f"could not generate a {task} story with {num_facts} facts in {_MAX_TRIES} tries; raise num_facts")


def worst_case_tokens(tokenizer: Tokenizer, template: str, *, num_facts: int) -> int:
    """The most tokens a prompt `template` (with {input}, {question}, maybe {target}) can take around
    num_facts hidden facts: the longest fact, question and answer this generator can write."""
    fact = max(len(tokenizer.encode(f"\n{p} {v} the {x}{end}\n")) for p in PERSONS
               for verbs, things, end in ((MOVE, LOCATIONS, "."), (GRAB + DROP, OBJECTS, " there."))
               for v in verbs for x in things)
    questions = ([f"Where is {p}?" for p in PERSONS] + [f"Where is the {o}?" for o in OBJECTS]
                 + [f"Where was the {o} before the {loc}?" for o in OBJECTS for loc in LOCATIONS])
    shell = max(len(tokenizer.encode(template.format(input="", question=q, target=loc)))
                for q in questions for loc in LOCATIONS)
    return shell + num_facts * fact


def haystack_text(kind: str, *, min_chars: int) -> str:
    """At least min_chars characters of ASCII text: stdlib sources ('embedded') or the filler ('filler')."""
    if kind == "filler":
        from recurlen.evaluation.tasks.passkey import FILLER

        return FILLER * (min_chars // len(FILLER) + 1)
    if kind != "embedded":
        raise ValueError(f"haystack {kind!r} is unknown; allowed: ['embedded', 'filler']")
    from recurlen.training.data.embedded import list_stdlib_sources

    parts, total = [], 0
    for _, path in list_stdlib_sources():
        # ASCII only: the byte tokenizer then round-trips the text exactly, so lengths stay exact.
        text = path.read_bytes().decode("ascii", errors="ignore")
        parts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    text = "\n".join(parts)
    return text * (min_chars // max(1, len(text)) + 1) if len(text) < min_chars else text


class Haystack:
    """A tokenized haystack; windows of any length (the text repeats when a window needs more)."""

    def __init__(self, tokenizer: Tokenizer, kind: str, *, min_tokens: int = POOL_TOKENS) -> None:
        self.tokenizer, self.kind = tokenizer, kind
        # At least POOL_TOKENS, so that short training contexts still see varied text; ~4 characters per
        # token is generous for BPE (for bytes it is 4x what is needed).
        min_tokens = max(min_tokens, POOL_TOKENS)
        self.ids = np.array(tokenizer.encode(haystack_text(kind, min_chars=4 * min_tokens)), dtype=np.int64)

    def window(self, rng: np.random.Generator, n: int) -> list[int]:
        if n <= 0:
            return []
        reps = -(-n // len(self.ids)) + 1
        ids = np.tile(self.ids, reps) if reps > 1 else self.ids
        start = int(rng.integers(0, len(ids) - n + 1))
        return ids[start:start + n].tolist()


def hide_facts(rng: np.random.Generator, facts: list[str], *, n_tokens: int, haystack: Haystack) -> list[int]:
    """Context of exactly n_tokens tokens: the facts, in order, at random places of a haystack window.

    n_tokens == 0 gives the facts alone, space separated (BABILong's '0k').
    """
    tok = haystack.tokenizer
    if n_tokens == 0:
        return tok.encode(" ".join(facts))
    fact_ids = [tok.encode("\n" + f + "\n") for f in facts]
    n_hay = n_tokens - sum(len(f) for f in fact_ids)
    if n_hay < 0:
        raise ValueError(f"a context of {n_tokens} tokens cannot hold the story's {len(facts)} facts "
                         f"({n_tokens - n_hay} tokens); use a longer length or fewer facts")
    hay = haystack.window(rng, n_hay)
    cuts = np.sort(rng.integers(0, n_hay + 1, len(facts))).tolist()
    out, prev = [], 0
    for cut, ids in zip(cuts, fact_ids):
        out += hay[prev:cut] + ids
        prev = cut
    return out + hay[prev:]


__all__ = ["LOCATIONS", "OBJECTS", "PERSONS", "Haystack", "Story", "World", "haystack_text", "hide_facts",
           "make_story", "worst_case_tokens"]
