"""Long-context tasks after RULER (Hsieh et al. 2024, "RULER: what's the real context size of
your long-context language models?", §3), generated offline from a seed at a target prompt
length in tokens of a tokenizer, or in bytes (``tokenizer=None``: the byte-level models here).

Tasks (each example a prompt, the answers, values that must be rejected, an exact-match check):

    multikey     needles "The magic number for KEY is 51234." among noise sentences, one per
                 key for ``keys`` keys; the question names one key (RULER NIAH multi-key):
                 the other keys' values are the distractors.
    multivalue   one key has ``values`` needles, ``keys`` − 1 other keys one each; answer all
                 the key's values, in any order (RULER NIAH multi-value).
    vartrack     chains "VAR ABCDE = 51234." "VAR FGHIJ = ABCDE." … of ``hops`` assignments,
                 ``chains`` − 1 of them distractors with other values, interleaved in order
                 across the noise; answer the value of the question's chain's last variable.
    freqwords    a word list with Zipf-like counts; answer the ``top`` most frequent words in
                 any order (RULER common-words extraction). Counts are built so that the
                 top + 1 most frequent words have distinct counts (the answer is unique).
    code         real Python source (``.py`` files of installed packages; never manual
                 pages): a window of a file that ends just before an identifier the file
                 defined (def / class / assignment at the start of a line) inside the window
                 and used last in the window's first half; the answer is that identifier.

Placement (``placement``): "after" puts the question after the context (``head`` = context,
``tail`` = question + answer cue), "before" before it (``head`` = question + context,
``tail`` = the cue only). ``head`` is what a pruned prefill always compresses; ``tail`` is
either prefilled with it (the question inside the compressed prompt) or decoded through the
pruned cache afterwards (the question after compression). The code task has no question; its
``tail`` is the start of the line holding the identifier, and only "after" applies.

Lengths: ``len(encode(head)) + len(encode(tail))`` lies in [(1 − ``TOLERANCE``) · length,
length] (encoded separately, as the evaluation does). Determinism: an example is a function of
(seed, split, task, length, index, options, tokenizer) and, for code, the corpus files: Python's
``random.Random`` seeded with a string of these. Splits: the seed string holds the split, so
train / validation / test draw disjoint streams; code files go to a split by the SHA-256 of
their path inside the corpus (80 / 10 / 10 %), so no file is in two splits.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import keyword
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CUE",
    "LENGTHS",
    "PLACEMENTS",
    "SPLITS",
    "SYNTHETIC",
    "TASKS",
    "TOLERANCE",
    "ByteTokenizer",
    "LongExample",
    "answer_prefix",
    "code_files",
    "example",
    "generate",
    "suite_hash",
]

TASKS = ("multikey", "multivalue", "vartrack", "freqwords", "code")
SYNTHETIC = TASKS[:4]
SPLITS = ("train", "validation", "test")
PLACEMENTS = ("after", "before")
LENGTHS = (1024, 2048, 4096, 8192)
TOLERANCE = 0.05
CUE = "Answer:"
DEFAULT_PACKAGES = ("transformers", "sympy", "scipy", "numpy", "torch")

# options per task, with defaults (an unknown option is a ValueError naming it)
OPTIONS: dict[str, dict[str, int]] = {
    "multikey": {"keys": 8, "digits": 5},
    "multivalue": {"keys": 4, "values": 4, "digits": 5},
    "vartrack": {"chains": 3, "hops": 4, "digits": 5},
    "freqwords": {"top": 3, "words": 40},
    "code": {"min_ident": 5},
}
_LOWER = {"keys": 1, "digits": 2, "values": 2, "chains": 1, "hops": 1, "top": 1, "words": 2,
          "min_ident": 2}

NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
         "There and back again.", "The river runs to the sea.", "A cat sleeps on the wall.",
         "Bread is baked in the morning.", "The train left the station.",
         "Snow fell on the hills.", "The lamp is on the desk.", "Birds sing at dawn.")
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
SYLLABLES = tuple(c + v for c in CONSONANTS for v in VOWELS)  # pseudo-words are made of these


class ByteTokenizer:
    """UTF-8 bytes as token ids 0 … 255 (the byte-level models of this project)."""

    vocab_size = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class LongExample:
    """One prompt (``head`` + ``tail``), its answers and distractors, and its exact-match check.

    ``ordered``: the answers must come in this order (else any order). ``target`` is the text
    a model is trained to produce after the prompt; :meth:`check` scores a generation."""

    task: str
    head: str
    tail: str
    question: str
    answers: tuple[str, ...]
    distractors: tuple[str, ...]
    ordered: bool = True
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def prompt(self) -> str:
        return self.head + self.tail

    @property
    def target(self) -> str:
        if self.task == "code":
            return self.answers[0]
        return " " + " ".join(self.answers) + "\n"

    def check(self, output: str) -> bool:
        """Exact match of a generation: code, the identifier followed by a character that
        cannot continue it (or the end); else the first line's words are the answers (in
        order when ``ordered``, as a multiset otherwise)."""
        if self.task == "code":
            name = self.answers[0]
            rest = output[len(name):len(name) + 1]
            return output.startswith(name) and not (rest.isalnum() or rest == "_")
        words = output.split("\n", 1)[0].split()
        if self.ordered:
            return words == list(self.answers)
        return sorted(words) == sorted(self.answers)


# -- helpers ---------------------------------------------------------------------------------------
def _measure_fn(tokenizer) -> Callable[[str], int]:
    if tokenizer is None:
        return lambda s: len(s.encode("utf-8"))
    if not hasattr(tokenizer, "encode"):
        raise TypeError(f"tokenizer: needs an encode(text) method, got {type(tokenizer).__name__}")
    cache: dict[str, int] = {}

    def measure(s: str) -> int:
        if s not in cache:
            n = len(tokenizer.encode(s, add_special_tokens=False))
            if len(cache) < 100_000:
                cache[s] = n
            return n
        return cache[s]
    return measure


def _word(rng: random.Random, syllables: int = 3) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables))


def _words(rng: random.Random, n: int, syllables: int = 3) -> list[str]:
    """``n`` distinct pseudo-words."""
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, syllables)
        if w not in out:
            out.append(w)
    return out


def _numbers(rng: random.Random, n: int, digits: int) -> list[str]:
    """``n`` distinct numbers of ``digits`` digits (no leading zero)."""
    out: list[str] = []
    while len(out) < n:
        v = str(rng.randrange(10 ** (digits - 1), 10 ** digits))
        if v not in out:
            out.append(v)
    return out


def _names(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if v not in out:
            out.append(v)
    return out


def _too_short(length: int, task: str) -> ValueError:
    return ValueError(f"length: {length} is too short for the {task} task with these options")


def _fill(rng: random.Random, required: list[str], budget: int, measure, sep: str,
          length: int, task: str) -> list[str]:
    """Noise sentences up to ``budget`` (units measured one by one, plus the separator), with
    ``required`` inserted at random places in their given order."""
    s = measure(sep)
    used = sum(measure(u) + s for u in required)
    if used > budget:
        raise _too_short(length, task)
    units: list[str] = []
    misses = 0
    while misses < 8:
        u = rng.choice(NOISE)
        c = measure(u) + s
        if used + c > budget:
            misses += 1
            continue
        units.append(u)
        used += c
    slots = sorted(rng.randrange(len(units) + 1) for _ in required)
    for offset, (p, r) in enumerate(zip(slots, required)):
        units.insert(p + offset, r)
    return units


def _fit(units: list[str], keep: set[int], build: Callable[[list[str]], int], length: int,
         task: str) -> list[str]:
    """Drop units not in ``keep`` (indices), last first, until ``build(units)`` ≤ length (the
    units measured one by one add up only approximately under a subword tokenizer)."""
    units = list(units)
    drop = [i for i in range(len(units)) if i not in keep]
    while build(units) > length:
        if not drop:
            raise _too_short(length, task)
        del units[drop.pop()]  # from the end: the indices still to drop stay valid
    return units


# -- the synthetic tasks --------------------------------------------------------------------------
def _needle_task(task: str, rng: random.Random, length: int, placement: str, measure,
                 opts: dict) -> LongExample:
    d = opts["digits"]
    if task == "multikey":
        keys = _words(rng, opts["keys"])
        values = _numbers(rng, len(keys), d)
        ask = rng.randrange(len(keys))
        needles = [f"The magic number for {k} is {v}." for k, v in zip(keys, values)]
        rng.shuffle(needles)
        answers = (values[ask],)
        distractors = tuple(v for i, v in enumerate(values) if i != ask)
        question = f"What is the magic number for {keys[ask]}?"
        ordered = True
    elif task == "multivalue":
        keys = _words(rng, opts["keys"])
        values = _numbers(rng, opts["values"] + len(keys) - 1, d)
        mine, others = values[:opts["values"]], values[opts["values"]:]
        needles = [f"The magic number for {keys[0]} is {v}." for v in mine]
        needles += [f"The magic number for {k} is {v}." for k, v in zip(keys[1:], others)]
        rng.shuffle(needles)
        order = [n.rsplit(" ", 1)[1][:-1] for n in needles if f" {keys[0]} " in n]
        answers, distractors = tuple(order), tuple(others)
        question = f"What are all the magic numbers for {keys[0]}?"
        ordered = False
        if not distractors:  # one key: a near miss of a true value stands in
            distractors = (mine[0][:-1] + str((int(mine[0][-1]) + 1) % 10),)
    else:  # vartrack
        chains, hops = opts["chains"], opts["hops"]
        values = _numbers(rng, chains, d)
        names = _names(rng, chains * hops)
        lines = []
        for c in range(chains):
            var = names[c * hops:(c + 1) * hops]
            lines.append([f"VAR {var[0]} = {values[c]}."] + [f"VAR {var[h]} = {var[h - 1]}."
                                                             for h in range(1, hops)])
        # interleave the chains, each in its own order
        needles, heads = [], [0] * chains
        while len(needles) < chains * hops:
            c = rng.choice([c for c in range(chains) if heads[c] < hops])
            needles.append(lines[c][heads[c]])
            heads[c] += 1
        answers, distractors = (values[0],), tuple(values[1:])
        question = f"What is the value of VAR {names[hops - 1]}?"
        ordered = True
        if not distractors:
            distractors = (values[0][:-1] + str((int(values[0][-1]) + 1) % 10),)
    cue = CUE + answer_prefix(task, question)
    tail = (f"\n{question}\n{cue}" if placement == "after" else f"\n{cue}")
    lead = "" if placement == "after" else question + "\n"
    budget = length - measure(tail) - measure(lead)
    units = _fill(rng, needles, budget, measure, "\n", length, task)
    keep = {i for i, u in enumerate(units) if u in needles}
    units = _fit(units, keep, lambda us: measure(lead + "\n".join(us)) + measure(tail), length, task)
    return LongExample(task, lead + "\n".join(units), tail, question, answers, distractors, ordered)


def answer_prefix(task: str, question: str) -> str:
    """What follows the cue before the answer: for the needle tasks the answer's sentence up to
    the value, naming the question's key, as RULER's answer prefixes do ("The magic number for
    KEY is"); empty for the others."""
    key = question.rsplit(" ", 1)[-1].rstrip("?")
    if task == "multikey":
        return f" The magic number for {key} is"
    if task == "multivalue":
        return f" The magic numbers for {key} are"
    return ""


def _freqwords(rng: random.Random, length: int, placement: str, measure, opts: dict) -> LongExample:
    top, n_words = opts["top"], opts["words"]
    if n_words <= top:
        raise ValueError(f"words: must exceed top ({top}), got {n_words}")
    vocab = _words(rng, n_words, 2)
    question = f"What are the {top} most frequent words in the list?"
    tail = (f"\n{question}\n{CUE}" if placement == "after" else f"\n{CUE}")
    lead = "" if placement == "after" else question + "\n"
    budget = length - measure(tail) - measure(lead)
    avg = sum(measure(w) + 1 for w in vocab) / len(vocab)
    zipf = [1.0 / (r + 1) for r in range(n_words)]
    scale = sum(zipf)
    total = max(int(budget / avg), 2 * n_words)
    for _ in range(6):
        counts = [max(1, round(total * z / scale)) for z in zipf]
        # distinct counts for the top + 1 words, the rest at most the (top + 1)-th's
        for r in range(top, -1, -1):
            nxt = counts[r + 1] if r + 1 < n_words else 0
            counts[r] = max(counts[r], nxt + 1) if r < top else counts[r]
        cap = counts[top]
        counts[top + 1:] = [min(c, cap) for c in counts[top + 1:]]
        bag = [w for w, c in zip(vocab, counts) for _ in range(c)]
        rng.shuffle(bag)
        size = measure(lead + " ".join(bag)) + measure(tail)
        rank = {w: r for r, w in enumerate(vocab)}
        for i in range(len(bag) - 1, -1, -1):  # drop the rarest words' last occurrences to fit
            if size <= length:
                break
            if rank[bag[i]] > top:
                size -= measure(bag[i]) + 1
                bag[i] = None  # type: ignore[call-overload]
        bag = [w for w in bag if w is not None]
        size = measure(lead + " ".join(bag)) + measure(tail)
        if (1 - TOLERANCE) * length <= size <= length:
            break
        total = max(2 * n_words, int(total * (length * (1 - TOLERANCE / 2)) / max(size, 1)))
    else:
        raise _too_short(length, "freqwords")
    final = {w: bag.count(w) for w in vocab}
    ranked = sorted(vocab, key=lambda w: -final[w])
    if final[ranked[top - 1]] <= final[ranked[top]]:  # the top words must be unique
        raise _too_short(length, "freqwords")
    return LongExample("freqwords", lead + " ".join(bag), tail, question, tuple(ranked[:top]),
                       (ranked[top],), ordered=False, meta={"counts": [final[w] for w in ranked[:top + 1]]})


# -- the code task ----------------------------------------------------------------------------------
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)|^([A-Za-z_]\w*)[ \t]*=[^=]",
                  re.MULTILINE)
_COMMON = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "args", "kwargs"}


def _split_of(relpath: str) -> str:
    h = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") % 10
    return "train" if h < 8 else ("validation" if h == 8 else "test")


@functools.lru_cache(maxsize=8)
def _corpus(roots: tuple[tuple[str, str], ...]) -> dict[str, tuple[tuple[str, str], ...]]:
    by_split: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for name, root in roots:
        base = Path(root)
        for p in base.rglob("*.py"):
            rel = f"{name}/{p.relative_to(base).as_posix()}"
            by_split[_split_of(rel)].append((rel, str(p)))
    return {s: tuple(sorted(v)) for s, v in by_split.items()}


def _package_roots(packages: Sequence[str]) -> tuple[tuple[str, str], ...]:
    import importlib.util

    roots = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"code_packages: {name!r} is not an installed package")
        roots.append((name, next(iter(spec.submodule_search_locations))))
    return tuple(roots)


def code_files(split: str, packages: Sequence[str] = DEFAULT_PACKAGES,
               roots: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(path inside the corpus, file path) of the split's ``.py`` files, sorted: the files of
    the installed ``packages`` (or of the folders ``roots``, name → folder)."""
    if split not in SPLITS:
        raise ValueError(f"split: one of {', '.join(SPLITS)}, got {split!r}")
    r = tuple(sorted(roots.items())) if roots is not None else _package_roots(packages)
    return list(_corpus(r)[split])


@functools.lru_cache(maxsize=256)
def _read_index(path: str, min_ident: int) -> tuple[str, dict[str, list[int]], dict[str, int]] | None:
    """The file's text (ASCII only, else None), each defined name's occurrences and first
    definition offset."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    if not raw.isascii() or b"\r" in raw:
        return None
    text = raw.decode("ascii")
    defs: dict[str, int] = {}
    for m in _DEF.finditer(text):
        name = m.group(1) or m.group(2)
        if len(name) >= min_ident and name not in _COMMON and not name.startswith("__"):
            defs.setdefault(name, m.start(1) if m.group(1) else m.start(2))
    occ: dict[str, list[int]] = {}
    for m in _IDENT.finditer(text):
        if m.group() in defs:
            occ.setdefault(m.group(), []).append(m.start())
    return text, occ, defs


def _code(rng: random.Random, length: int, measure, opts: dict, files: list[tuple[str, str]],
          byte_level: bool) -> LongExample:
    if not files:
        raise ValueError("code_files: no .py files in this split of the corpus")
    for _ in range(200):
        rel, path = files[rng.randrange(len(files))]
        idx = _read_index(path, opts["min_ident"])
        if idx is None:
            continue
        text, occ, defs = idx
        cands = []
        for name, pos in occ.items():
            for j in range(1, len(pos)):
                cands.append((pos[j], pos[j - 1], name))
        rng.shuffle(cands)
        for p, q, name in cands[:50]:
            line = text.rfind("\n", 0, p) + 1
            tail = text[line:p]
            if len(tail) > 80 or "#" in tail or tail.count('"') % 2 or tail.count("'") % 2:
                continue
            budget = length - measure(tail)
            start = _window_start(text, line, budget, measure, byte_level)
            if start is None:
                continue
            head = text[start:line]
            size = measure(head) + measure(tail)
            if not (1 - TOLERANCE) * length <= size <= length:
                continue
            # defined inside the window (before the last use), last used in its first half
            if not start <= defs[name] <= q or q >= start + (line - start) // 2:
                continue
            others = sorted(n for n, d in defs.items() if n != name and start <= d < line
                            and not name.startswith(n) and not n.startswith(name))
            if not others:
                continue
            distractors = tuple(rng.sample(others, min(3, len(others))))
            return LongExample("code", head, tail, "", (name,), distractors,
                               meta={"file": rel, "offset": p})
    raise ValueError(f"length: found no code prompt of {length} in 200 files of this split")


def _window_start(text: str, line: int, budget: int, measure, byte_level: bool) -> int | None:
    """The offset whose text up to ``line`` measures ``budget`` (at most), or None."""
    if budget <= 0:
        return None
    if byte_level:
        s = line - budget
        return s if s >= 0 else None
    if measure(text[:line]) < budget:
        return None
    lo, hi = 0, line  # measure(text[s:line]) decreases with s
    while lo < hi:
        mid = (lo + hi) // 2
        if measure(text[mid:line]) > budget:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- the public API --------------------------------------------------------------------------------
def _check(task: str, length: int, split: str, placement: str, options: dict) -> dict:
    if task not in TASKS:
        raise ValueError(f"task: one of {', '.join(TASKS)}, got {task!r}")
    if split not in SPLITS:
        raise ValueError(f"split: one of {', '.join(SPLITS)}, got {split!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if task == "code" and placement != "after":
        raise ValueError("placement: the code task has no question to move; use 'after'")
    if isinstance(length, bool) or not isinstance(length, int) or length < 16:
        raise ValueError(f"length: an int ≥ 16 (tokens), got {length!r}")
    unknown = sorted(set(options) - set(OPTIONS[task]))
    if unknown:
        raise ValueError(f"{unknown[0]}: not an option of the {task} task "
                         f"(options: {', '.join(OPTIONS[task])})")
    opts = {**OPTIONS[task], **options}
    for k, v in opts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < _LOWER[k]:
            raise ValueError(f"{k}: an int ≥ {_LOWER[k]}, got {v!r}")
    return opts


def example(task: str, length: int, index: int, *, split: str = "validation", seed: int = 0,
            placement: str = "after", tokenizer=None, code_packages: Sequence[str] = DEFAULT_PACKAGES,
            code_roots: dict[str, str] | None = None, **options) -> LongExample:
    """The ``index``-th example of ``task`` at ``length`` tokens (bytes when ``tokenizer`` is
    None) of ``split`` and ``seed``. ``options``: the task's (:data:`OPTIONS`)."""
    opts = _check(task, length, split, placement, options)
    measure = _measure_fn(tokenizer)
    rng = random.Random(f"long_tasks:{seed}:{split}:{task}:{length}:{index}:{placement}:"
                        + ",".join(f"{k}={v}" for k, v in sorted(opts.items())))
    if task == "freqwords":
        ex = _freqwords(rng, length, placement, measure, opts)
    elif task == "code":
        ex = _code(rng, length, measure, opts, code_files(split, code_packages, code_roots),
                   tokenizer is None)
    else:
        ex = _needle_task(task, rng, length, placement, measure, opts)
    ex.meta.update({"length": measure(ex.head) + measure(ex.tail), "index": index})
    return ex


def generate(task: str, n: int, length: int, **kwargs) -> list[LongExample]:
    """``n`` examples (indices 0 … n − 1) of :func:`example`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: an int ≥ 0, got {n!r}")
    return [example(task, length, i, **kwargs) for i in range(n)]


def suite_hash(examples: Sequence[LongExample]) -> str:
    """SHA-256 of the examples' prompts, answers and distractors (a determinism check)."""
    h = hashlib.sha256()
    for ex in examples:
        for part in (ex.task, ex.head, ex.tail, *ex.answers, "|", *ex.distractors):
            h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()
