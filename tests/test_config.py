"""config.py: YAML + overrides into frozen dataclasses, errors that name the field."""

from dataclasses import dataclass

import pytest

from attnprune.runs.config import (
    ConfigError,
    dump_yaml,
    load_config,
    parse_command_line,
    parse_overrides,
)


@dataclass(frozen=True)
class Cfg:
    keep_ratio: float = 0.5
    epochs: int = 12
    seeds: tuple[int, ...] = (42, 43)
    method: str = "entropy"
    quick: bool = False
    note: str | None = None

    def __post_init__(self):
        if not 0 < self.keep_ratio <= 1:
            raise ValueError(f"keep_ratio must be in (0, 1], got {self.keep_ratio}")


def test_overrides_parse():
    assert parse_overrides(["--keep-ratio", "0.3", "--quick", "--seeds=1,2"]) == {
        "keep_ratio": "0.3", "quick": True, "seeds": "1,2"}
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_overrides(["positional"])


def test_types_coerced():
    cfg = load_config(Cfg, None, ["--keep-ratio", "0.3", "--epochs", "3", "--seeds", "1,2,3",
                                  "--quick", "--note", "none"])
    assert cfg == Cfg(keep_ratio=0.3, epochs=3, seeds=(1, 2, 3), quick=True, note=None)
    assert load_config(Cfg, None, {"seeds": "[4, 5]"}).seeds == (4, 5)


@pytest.mark.parametrize("args, field", [
    (["--keep-ratio", "abc"], "keep_ratio"),
    (["--epochs", "2.5"], "epochs"),
    (["--quick", "maybe"], "quick"),
    (["--seeds", "1,x"], "seeds"),
    (["--keep-ratio", "1.5"], "keep_ratio"),
    (["--bogus", "1"], "bogus"),
])
def test_errors_name_the_field(args, field):
    with pytest.raises(ConfigError, match=field):
        load_config(Cfg, None, args)


def test_yaml_file_and_missing_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("keep_ratio: 0.7\nseeds: [1]\n")
    cfg = load_config(Cfg, f, ["--epochs", "1"])
    assert (cfg.keep_ratio, cfg.seeds, cfg.epochs) == (0.7, (1,), 1)
    with pytest.raises(ConfigError, match="config: file not found"):
        load_config(Cfg, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Cfg, bad)
    assert "keep_ratio: 0.7" in dump_yaml(cfg)


def test_command_line_out_and_resume(tmp_path):
    cl = parse_command_line(["--out", str(tmp_path), "--epochs", "2"], Cfg)
    assert cl.out == tmp_path and not cl.exact_out and cl.config.epochs == 2
    (tmp_path / "config.yaml").write_text("{}")
    assert parse_command_line(["--out", str(tmp_path)], Cfg).exact_out  # a results folder resumes
    with pytest.raises(ConfigError, match="config"):
        parse_command_line(["--config", str(tmp_path / "missing.yaml")], Cfg)
