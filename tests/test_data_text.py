"""Text datasets: file formats, label encoding, the fixed stratified split, clear errors."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import require_shared_file  # tests/ is on sys.path

from attnprune.research.data.text import DataError, load_text_data, load_text_files, shared_data_dir


def write_csv(path, n=60, classes=("neg", "neu", "pos"), text_col="text", label_col="label"):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([text_col, label_col, "extra"])
        for i in range(n):
            w.writerow([f"row {i} about {classes[i % len(classes)]}", classes[i % len(classes)], i])
    return path


def test_csv_string_labels_three_classes(tmp_path):
    d = load_text_data(f"csv:{write_csv(tmp_path / 'd.csv')}")
    assert d.label_names == ("neg", "neu", "pos") and d.n_classes == 3
    assert (len(d.train), len(d.val), len(d.test)) == (48, 6, 6)
    for split in (d.train, d.val, d.test):
        assert np.bincount(split.labels, minlength=3).min() >= 2  # stratified
        # the label matches the text it came from
        assert all(d.label_names[y] in t for t, y in zip(split.texts, split.labels))
    all_texts = d.train.texts + d.val.texts + d.test.texts
    assert len(set(all_texts)) == 60  # disjoint splits covering every row


def test_split_is_fixed(tmp_path):
    p = write_csv(tmp_path / "d.csv")
    assert load_text_data(f"csv:{p}").test.texts == load_text_data(f"csv:{p}").test.texts


def test_jsonl_integer_labels_and_custom_columns(tmp_path):
    p = tmp_path / "d.jsonl"
    with p.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"sentence": f"s{i}", "y": i % 2}) + "\n")
    d = load_text_data(f"jsonl:{p}", text_column="sentence", label_column="y")
    assert d.label_names == ("0", "1")
    assert len(d.train) + len(d.val) + len(d.test) == 40


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_text_data(f"csv:{tmp_path / 'nope.csv'}")
    p = write_csv(tmp_path / "d.csv", label_col="target")
    with pytest.raises(ValueError, match="no column 'label'"):
        load_text_data(f"csv:{p}")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_text_data("parquet:x")
    with pytest.raises(ValueError, match="single class"):
        load_text_data(f"csv:{write_csv(tmp_path / 'one.csv', classes=('a',))}")


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNPRUNE_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    write_csv(tmp_path / "tweets_sentiment.csv", n=30, classes=("0", "1"))
    d = load_text_data("tweets")
    assert d.n_classes == 2 and len(d.test) == 3


def test_shared_tweets_split_sizes(monkeypatch):
    monkeypatch.delenv("ATTNPRUNE_DATA", raising=False)
    require_shared_file(shared_data_dir() / "tweets_sentiment.csv")
    d = load_text_data("tweets")
    assert (len(d.train), len(d.val), len(d.test)) == (15831, 1979, 1979)
    assert d.label_names == ("0", "1")


# ----------------------------------------------------------------------------- issue 26
def test_plain_path_is_read_by_its_extension(tmp_path):
    p = write_csv(tmp_path / "reviews.csv")
    assert load_text_data(str(p)).test.texts == load_text_data(f"csv:{p}").test.texts
    q = tmp_path / "reviews.jsonl"
    q.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(20)))
    assert load_text_data(str(q)).n_classes == 2
    with pytest.raises(DataError, match=r"unknown dataset .*reviews.txt"):
        load_text_data(str(tmp_path / "reviews.txt"))


def test_bad_files_name_file_line_and_column(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty.csv is empty"):
        load_text_data(str(empty))
    header = tmp_path / "header.csv"
    header.write_text("text,label\n")
    with pytest.raises(DataError, match=r"header.csv has a header line \(text, label\) but no rows"):
        load_text_data(str(header))
    p = write_csv(tmp_path / "d.csv", label_col="sentiment")
    with pytest.raises(DataError, match=r"d.csv has no column 'label' \(columns: text, sentiment, "
                                        r"extra\); set label_column \(--label-column\)"):
        load_text_data(str(p))
    one = write_csv(tmp_path / "one.csv", classes=("pos",))
    with pytest.raises(DataError, match=r"one.csv column 'label': a single class \('pos'"):
        load_text_data(str(one))
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"text,label\nfine,0\ncaf\xe9 ok,1\n" + b"x,0\n" * 20)
    with pytest.raises(DataError, match=r"latin.csv line 3, character 4: byte 0xe9 is not UTF-8"):
        load_text_data(str(latin))
    nolabel = tmp_path / "nolabel.csv"
    nolabel.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(20)) + "t20,\n")
    with pytest.raises(DataError, match=r"nolabel.csv line 22, column 'label': the label is empty"):
        load_text_data(str(nolabel))
    bom = tmp_path / "bom.csv"  # Excel's UTF-8 with a byte-order mark: the header stays "text"
    bom.write_bytes(b"\xef\xbb\xbf" + write_csv(tmp_path / "plain.csv").read_bytes())
    assert load_text_data(str(bom)).n_classes == 3


def _rows(path, texts, labels, text_col="text", label_col="label"):
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow([text_col, label_col])
            w.writerows(zip(texts, labels))
    else:
        path.write_text("".join(json.dumps({text_col: t, label_col: y}) + "\n"
                                for t, y in zip(texts, labels)))
    return path


def test_own_splits_are_the_files(tmp_path):
    cls = ("neg", "pos")
    tr = _rows(tmp_path / "train.csv", [f"train {i}" for i in range(40)],
               [cls[i % 2] for i in range(40)])
    va = _rows(tmp_path / "dev.jsonl", [f"dev {i}" for i in range(6)], [cls[i % 2] for i in range(6)])
    te = _rows(tmp_path / "test.csv", [f"test {i}" for i in range(8)], [cls[i % 2] for i in range(8)])
    d = load_text_data("tweets", train_file=tr, validation_file=va, test_file=te)
    assert (len(d.train), len(d.val), len(d.test)) == (40, 6, 8)
    assert d.test.texts == [f"test {i}" for i in range(8)] and d.label_names == cls
    assert d.test.labels.tolist() == [0, 1] * 4
    assert "train=" in d.source and "test.csv" in d.source
    # no test file: the validation file is scored, val is 10 % of train (as for GLUE)
    d2 = load_text_files(tr, va)
    assert d2.test.texts == [f"dev {i}" for i in range(6)]
    assert (len(d2.train), len(d2.val)) == (36, 4)
    assert not set(d2.train.texts) & set(d2.val.texts)


def test_own_splits_refuse_overlap_missing_column_and_unseen_class(tmp_path):
    tr = _rows(tmp_path / "train.csv", [f"t {i}" for i in range(20)], [i % 2 for i in range(20)])
    te = _rows(tmp_path / "test.csv", ["new one", "t   7", "other"], [0, 1, 0])
    with pytest.raises(DataError, match=r"the same text is in .*train.csv line 9 and "
                                        r".*test.csv line 3: 't 7'"):
        load_text_files(tr, test_file=te)
    bad = _rows(tmp_path / "val.csv", ["a", "b"], [0, 1], label_col="y")
    with pytest.raises(DataError, match=r"val.csv has no column 'label'.*--label-column"):
        load_text_files(tr, bad, te)
    unseen = _rows(tmp_path / "unseen.csv", ["a", "b"], [0, 2])
    with pytest.raises(DataError, match=r"unseen.csv line 3, column 'label': class '2' is not in "
                                        r"the train file"):
        load_text_files(tr, test_file=unseen)
    with pytest.raises(DataError, match="--validation-file or --test-file"):
        load_text_files(tr)
    with pytest.raises(DataError, match=r"data.txt: unknown file type '.txt'"):
        load_text_files(tr, test_file=tmp_path / "data.txt")


def test_glue_offline_is_one_line(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'glue' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"^data: glue/sst2 needs the hub or a local datasets "
                                        r"cache, and neither answered \(ConnectionError: "
                                        r"Couldn't reach 'glue' on the Hub \(LocalEntryNotFoundError\)\); use a file"):
        load_text_data("glue/sst2")


def test_docstring_domain_is_a_data_name():
    """``data: docstring_domain`` reaches its loader (a corpus that is not built says how to
    build it, naming the script), not "unknown dataset"."""
    from attnprune.research.data.text import load_text_data

    with pytest.raises(FileNotFoundError, match="build_docstring_domain"):
        load_text_data("docstring_domain:/nonexistent/docstring_domain")
    try:
        data = load_text_data("docstring_domain")
    except FileNotFoundError as e:  # not built on this machine (CI): the same message
        assert "build_docstring_domain" in str(e)
    else:
        assert len(set(data.train.labels)) == 3
