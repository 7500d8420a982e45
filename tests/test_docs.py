"""The README and docs/ can be trusted as written (scripts/check_docs.py; issue 23 item 9, issue 26).

The repo's own docs must pass; and the checker must fail on each defect it names: a broken link
or anchor, a table without its source, a missing results folder, an unknown exception, a
quoted command with an unknown option or a badly typed value. (The README's snippets run as
written, each alone and offline: tests/test_new_user_docs.py.)
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
check_docs = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_docs", check_docs)  # dataclasses look their module up
_spec.loader.exec_module(check_docs)


def test_repo_docs_pass():
    problems = check_docs.check(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_every_known_exception_has_a_reason_and_a_table():
    # a stale entry would hide nothing, but it must not linger either (check() reports it)
    assert all(reason.strip() for reason in check_docs.KNOWN_EXCEPTIONS.values())


@pytest.fixture()
def repo(tmp_path):
    """A small copy of the repo's docs layout: configs, a results folder, one page."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "docs" / "results" / "run_a").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "run_a" / "summary.json").write_text("{}")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n\ntext\n")
    return tmp_path


def _page(repo: Path, body: str) -> list[str]:
    (repo / "README.md").write_text(body)
    return [p.text for p in check_docs.check(repo, known={})]


GOOD = """# Title

See [the other page](docs/other.md#a-section).

**Source** (`run-a`): [`docs/results/run_a`](docs/results/run_a/summary.json), written by `attnprune finetune --data tweets --method attention_mass --keep-ratio 0.3,0.5 --out docs/results/run_a --exact-out`.

| a | b |
|---|---|
| 0.5 | 0.7 |

```bash
attnprune lm --preset cpu-small --method ltp --steps 100 --out runs/
```
"""


def test_a_good_page_passes(repo):
    assert _page(repo, GOOD) == []


def test_broken_link_fails(repo):
    errs = _page(repo, GOOD.replace("docs/other.md#", "docs/missing.md#"))
    assert any("broken link: docs/missing.md" in e for e in errs)


def test_broken_anchor_fails(repo):
    errs = _page(repo, GOOD.replace("#a-section", "#no-such-section"))
    assert any("no heading for anchor #no-such-section" in e for e in errs)


def test_removed_results_folder_fails(repo):
    shutil.rmtree(repo / "docs" / "results" / "run_a")
    errs = _page(repo, GOOD)
    assert any("docs/results/run_a is missing" in e for e in errs)
    assert any("broken link: docs/results/run_a/summary.json" in e for e in errs)


def test_table_without_source_fails(repo):
    errs = _page(repo, GOOD.replace("**Source** (`run-a`)", "Source (`run-a`)"))
    assert any("table without a source caption" in e for e in errs)


def test_caption_without_command_fails(repo):
    errs = _page(repo, GOOD.replace("`attnprune finetune", "attnprune finetune").replace(
        "--exact-out`.", "--exact-out."))
    assert any("names no command" in e for e in errs)


def test_exceptions_must_be_listed_and_used(repo):
    body = GOOD.replace("(`run-a`): [`docs/results/run_a`](docs/results/run_a/summary.json), written by",
                        "(`lost-table`): not committed; reproduce with")
    errs = _page(repo, body)
    assert any("'lost-table' says its source is not committed but is not in KNOWN_EXCEPTIONS"
               in e for e in errs)
    (repo / "README.md").write_text(body)
    assert check_docs.check(repo, known={"lost-table": "its machine was reset"}) == []
    stale = check_docs.check(repo, known={"lost-table": "reset", "gone": "reset"})
    assert [p.text for p in stale] == ["KNOWN_EXCEPTIONS lists 'gone', which no table uses: remove it"]


def test_unknown_option_fails(repo):
    errs = _page(repo, GOOD.replace("--keep-ratio 0.3,0.5", "--keep-ratoi 0.3,0.5"))
    assert any("attnprune finetune: unknown option --keep-ratoi" in e for e in errs)


def test_badly_typed_value_fails(repo):
    errs = _page(repo, GOOD.replace("--steps 100", "--steps many"))
    assert any("attnprune lm:" in e and "steps" in e for e in errs)


def test_unknown_command_and_missing_config_fail(repo):
    body = GOOD + ("\n`attnprune finetuen --data tweets`\n\n"
                   "`attnprune pareto --config configs/nope.yaml --out runs/`\n")
    errs = _page(repo, body)
    assert any("unknown command: attnprune finetuen" in e for e in errs)
    assert any("--config configs/nope.yaml does not exist" in e for e in errs)


def test_an_empty_list_is_a_value(repo):
    """``--layers []`` gives the option an empty list; the next option is not its value."""
    ok = "\n`attnprune embed-front --data retrieval:DIR --layers [] --int8 true --out OUT`\n"
    assert _page(repo, GOOD + ok) == []
    errs = _page(repo, GOOD + ok.replace("--layers []", "--layers [x]"))
    assert any("layers" in e for e in errs)


def test_placeholders_and_alternatives_are_not_type_checked(repo):
    body = GOOD + ("\n`attnprune finetune --model M --data D --method X --init-from runs/<run> --out DIR`\n\n"
                   "`attnprune bench encoder|attention --threads 1`\n")
    assert _page(repo, body) == []
    errs = _page(repo, GOOD + "\n`attnprune bench encoder|nonsense --threads 1`\n")
    assert any("unknown command: attnprune bench nonsense" in e for e in errs)


def test_scripts_and_modules_are_checked(repo):
    (repo / "scripts").mkdir()
    (repo / "scripts" / "tool.py").write_text('ap.add_argument("--rounds")\n')
    body = GOOD + ("\n`python scripts/tool.py --rounds 3`\n\n`python scripts/tool.py --repeats 3`\n\n"
                   "`python scripts/gone.py`\n\n`python -m attnprune.no_such_module`\n")
    errs = _page(repo, body)
    assert not any("--rounds" in e for e in errs)
    assert any("scripts/tool.py does not know --repeats" in e for e in errs)
    assert any("no script scripts/gone.py" in e for e in errs)
    assert any("no module attnprune.no_such_module" in e for e in errs)


def test_command_modules_outside_the_cli_table_use_their_config(repo):
    # ``python -m attnprune.<module>`` of a command module reads options into its config dataclass
    ok = _page(repo, GOOD + "\n`python -m attnprune.bench.prefill --clock cpu --out DIR`\n")
    assert ok == []
    errs = _page(repo, GOOD + "\n`python -m attnprune.bench.prefill --clokc cpu --out DIR`\n")
    assert any("unknown option --clokc" in e for e in errs)


# ---------------------------------------------------------------------------------------------
# The README's printed outputs are the committed outputs of scripts/readme_outputs.py (issue 31)
# ---------------------------------------------------------------------------------------------
def _readme_text_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Three uses", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)


def test_readme_printed_outputs_are_the_committed_ones():
    """Uses 2 and 3 quote what ``python scripts/readme_outputs.py`` printed, word for word
    (the files in docs/results/readme); use 1's is checked by running it (above)."""
    folder = ROOT / "docs" / "results" / "readme"
    blocks = _readme_text_blocks()
    assert len(blocks) == 4, "README uses: expected 4 printed outputs"
    for block, name in zip(blocks[1:], ("use2.txt", "use3_pipeline.txt", "use3_onnx.txt"),
                           strict=True):
        assert block == (folder / name).read_text(encoding="utf-8"), (
            f"README quotes an output that differs from docs/results/readme/{name}: run "
            "python scripts/readme_outputs.py and paste its files")
    assert "tweets_sentiment.csv" in (folder / "reviews.md").read_text(encoding="utf-8")
