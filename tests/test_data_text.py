"""Text datasets: file formats, label encoding, the fixed stratified split, clear errors."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import require_shared_file  # tests/ is on sys.path

from attnprune.data.text import load_text_data, shared_data_dir


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
