"""The `--json` key listings of docs/commands/*.md name the keys the commands print: no key missing from
a page, none on a page that the document lacks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
PAGES = Path(__file__).parent.parent / "docs" / "commands"
MORE = "…"  # an item that says the listing goes on: the keys shown must exist, others may too


def _split(text: str) -> list[str]:
    """Top-level items of a listing: split at commas and semicolons outside braces."""
    items, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0 and ch in ",;":
            items.append(text[start:k])
            start = k + 1
    return [s.strip() for s in [*items, text[start:]] if s.strip()]


def parse(text: str) -> dict[str, object]:
    """`a, b {x, y{…}}, c[] {z}, …` -> {"a": None, "b": {"x": None, "y": MORE}, "c": {"z": None}, MORE: None}.
    Remarks in parentheses are dropped; a value list such as `compute | tp` is a scalar (None)."""
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    out: dict[str, object] = {}
    for item in _split(text):
        if "{" in item:
            name, inner = item.split("{", 1)
            inner = inner[: inner.rindex("}")].strip()
            out[name.strip().removesuffix("[]")] = MORE if inner == MORE else parse(inner)
        elif "|" not in item:
            out[item.split()[0].removesuffix("[]")] = None
    return out


def listing(page: str) -> dict[str, object]:
    """The page's `--json` block: a line at column 0 opens a key, indented lines continue its listing; a
    listing of values (`compute | tp`) or of a list's items (`[…]`) holds no keys."""
    text = (PAGES / page).read_text()
    block = text.split("## `--json`", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    groups: dict[str, str] = {}
    for line in block.splitlines():
        if line and not line[0].isspace():
            key, _, rest = line.partition(" ")
            key = key.removesuffix("[]")
            groups[key] = rest
        elif line.strip():
            groups[key] += " " + line.strip()
    return {k: (None if ("|" in v and "," not in v) or v.lstrip().startswith("[") else parse(v)) for k, v in groups.items()}


def differences(shown: dict[str, object], doc: object, where: str = "") -> list[str]:
    """Keys the page names that the document lacks, and (unless the listing ends in …) the reverse."""
    if isinstance(doc, list):
        doc = doc[0] if doc else {}
    if not isinstance(doc, dict):
        return [f"{where or 'top'}: the page lists keys of a {type(doc).__name__}"]
    out = [f"{where}{k}: on the page, not in the document" for k in shown if k != MORE and k not in doc]
    if MORE not in shown:
        out += [f"{where}{k}: in the document, not on the page" for k in doc if k not in shown]
    for k, sub in shown.items():
        if isinstance(sub, dict) and k in doc and doc[k] is not None:
            out += differences(sub, doc[k], f"{where}{k}.")
    return out


def _json(*argv: str) -> dict:
    res = runner.invoke(app, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


H100 = ["--cluster", "dgx-h100", "--gpus", "8"]
# --tokens and --gpu-hour-cost add time_to_train; pp 2 gives every pipeline key
ESTIMATE = ["llama-3.1-8b", *H100, "--pp", "2", "--tokens", "1e12", "--gpu-hour-cost", "2"]


def test_the_parser_reads_nesting_lists_remarks_and_a_trailing_ellipsis():
    assert parse("a, b {x, y{…}}, c[] {z (a remark)}; d (with --e), …") == {
        "a": None, "b": {"x": None, "y": MORE}, "c": {"z": None}, "d": None, MORE: None}
    assert differences({"a": None, "b": {"x": None}}, {"a": 1, "b": [{"x": 1, "y": 2}]}) == [
        "b.y: in the document, not on the page"]
    assert differences({"a": None, MORE: None}, {"a": 1, "z": 2}) == []


def test_memory_json_keys_are_the_pages():
    assert differences(listing("memory.md"), _json("memory", *ESTIMATE[:-4])) == []


def test_estimate_json_keys_are_the_pages():
    # estimate.md lists the keys it adds to memory's
    shown = {**listing("memory.md"), **listing("estimate.md")}
    assert differences(shown, _json("estimate", *ESTIMATE)) == []


def test_plan_json_keys_are_the_pages():
    # a global batch of 12 on 8 GPUs adds batch_hint; --timings adds search.seconds
    doc = _json("plan", "llama-3.1-8b", *H100, "--global-batch-size", "12", "--top", "1", "--timings",
                "--tokens", "1e12", "--fix", "tp=1")
    assert differences(listing("plan.md"), doc) == []


def test_sweep_json_keys_are_the_pages():
    doc = _json("sweep", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8,16", "--tokens", "1e12", "--fix", "tp=1")
    assert differences(listing("sweep.md"), doc) == []
