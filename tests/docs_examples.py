"""The `$ planner …` examples of README.md and docs/, run again and compared with what the pages show.

A code block may hold several examples: a line starting `$ planner ` (continued by lines while one ends in
`\\`) is a command, and the lines after it, up to the next command or the block's end, are its output.
An output holding a line that starts with `...` (maybe followed by a remark) is an excerpt: its other lines must appear, in order, in the real output.
Commands that write under `/tmp/` write under a fresh directory instead, named back in the output.
The examples of `planner validate` that run a job show one machine's measurement and are not re-run;
its error examples are. A line `$ cat /tmp/DIR/FILE` shows a file an earlier example of the page wrote
there (its README, its train.sh), whole or as an excerpt.

    python tests/docs_examples.py            # list the examples that differ
    python tests/docs_examples.py --write    # rewrite every full output from a fresh run, and the numbers of excerpts
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "commands").glob("*.md"))]
# the width the pages are written at: wide enough for the plan and sweep tables without wrapping
COLUMNS = 120
ENV = {"COLUMNS": str(COLUMNS), "NO_COLOR": "1", "TERM": "dumb"}
WHAT_FITS_BUDGET_S = 120.0  # runners._what_fits' 6 s, for a loaded machine (the whole plan.md 405B example: 5.1 s alone)
ELIDED = "..."
COMMANDS = ("$ planner ", "$ cat /tmp/")  # the lines that start an example
# wall-clock figures a page cannot hold fixed: the search's own time on the status line
TIMING = [(re.compile(r"^search: \d+\.\d+ s · "), "search: … s · ")]


@dataclass
class Example:
    page: Path
    line: int  # 1-based line of the `$ planner` command
    argv: list[str]
    shown: list[str]  # the output lines as the page shows them
    start: int  # 0-based index of the first output line in the page
    end: int  # 0-based index one past the last output line

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def excerpt(self) -> bool:
        return any(ln.startswith(ELIDED) for ln in self.shown)

    @property
    def measured(self) -> bool:
        """A validate run: one machine's timings, not a function of the input."""
        return self.argv[:1] == ["validate"] and not any(ln.startswith("error:") for ln in self.shown)


def examples(page: Path) -> list[Example]:
    lines = page.read_text().split("\n")
    found: list[Example] = []
    in_block = False
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if not (in_block and lines[i].startswith(COMMANDS)):
            i += 1
            continue
        first = i
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        start = i
        while i < len(lines) and not lines[i].startswith("```") and not lines[i].startswith(COMMANDS):
            i += 1
        words = shlex.split(command)
        found.append(Example(page, first + 1, words if words[0] == "cat" else words[1:], lines[start:i], start, i))
    return found


def _mask(lines: list[str]) -> list[str]:
    out = []
    for ln in lines:
        for pattern, repl in TIMING:
            ln = pattern.sub(repl, ln)
        out.append(ln.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


def run(example: Example, scratch: Path) -> list[str]:
    """The example's output now, as the console entry point prints it (stdout and stderr together), with /tmp/
    paths written under `scratch` and named back."""
    from planner import runners
    from planner.cli import main

    tmp = "/tmp/"
    argv = [a.replace(tmp, f"{scratch}/", 1) if a.startswith(tmp) else a for a in example.argv]
    if argv[0] == "cat":  # a file an earlier example wrote
        path = Path(argv[1])
        return path.read_text().split("\n") if path.is_file() else [f"cat: {example.argv[1]}: No such file or directory"]
    out = io.StringIO()
    # the "it fits on N GPUs" hint of an infeasible plan stops at a wall-clock budget (runners._what_fits);
    # the page shows the hint a machine not shared with other work gives, so the check gives it the time
    with (mock.patch.object(sys, "argv", ["planner", *argv]), mock.patch.dict(os.environ, ENV),
          mock.patch.dict(runners._what_fits.__kwdefaults__, budget_s=WHAT_FITS_BUDGET_S),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit)):
        main()
    return out.getvalue().replace(f"{scratch}/", tmp).split("\n")


def differs(example: Example, actual: list[str]) -> str | None:
    """None when the page shows what the command prints now, else a short account of the first difference."""
    shown, now = _mask(example.shown), _mask(actual)
    if example.excerpt:
        it = iter(now)
        for ln in shown:
            if ln.startswith(ELIDED):
                continue
            if not any(ln == got for got in it):
                return f"excerpt line not in the output, in order: {ln!r}"
        return None
    if shown == now:
        return None
    for k, (a, b) in enumerate(zip(shown, now)):
        if a != b:
            return f"output line {k + 1}: page {a!r}, now {b!r}"
    return f"page has {len(shown)} lines, the command prints {len(now)}"


def check_page(page: Path) -> list[tuple[Example, list[str], str | None]]:
    """Each runnable example of one page with its output now; examples share a scratch directory, in page order."""
    results = []
    with tempfile.TemporaryDirectory(prefix="docs") as scratch:
        for ex in examples(page):
            if ex.measured:
                continue
            actual = run(ex, Path(scratch))
            results.append((ex, actual, differs(ex, actual)))
    return results


# a number as the pages print them (signs, thousands separators, decimals, a percent sign), standing on
# its own: the digits inside a name (llama-3.1-8b, pp4v5) are part of the name
NUMBER = re.compile(r"(?<![\w.-])[-+]?\d[\d,]*(?:\.\d+)?%?(?!\w)")


def _shape(line: str) -> str:
    """A line with its timings masked, every number replaced by '#' and its runs of spaces by one
    (right-aligned columns move with a number's width)."""
    masked = _mask([line])
    return " ".join(NUMBER.sub("#", masked[0]).split()) if masked else ""


def refreshed_excerpt(example: Example, actual: list[str]) -> list[str] | None:
    """The excerpt with each shown line replaced by the output line that reads the same but for its
    numbers (the next such line, in order), or None where some shown line has no such line."""
    now = [ln.rstrip() for ln in actual]
    out, at = [], 0
    for ln in example.shown:
        if ln.startswith(ELIDED) or not ln.strip():
            out.append(ln)
            continue
        label = _shape(ln)
        k = next((k for k in range(at, len(now)) if _shape(now[k]) == label), None)
        if k is None:
            return None
        out.append(now[k])
        at = k + 1
    return out


def write(page: Path, results: list[tuple[Example, list[str], str | None]]) -> int:
    """Put each full example's fresh output in the page, and each excerpt's lines with their new numbers
    where every one of them is still printed (bottom up, so earlier indices stay valid)."""
    lines = page.read_text().split("\n")
    changed = 0
    for ex, actual, diff in sorted(results, key=lambda r: -r[0].start):
        if diff is None:
            continue
        if ex.excerpt:
            fresh_excerpt = refreshed_excerpt(ex, actual)
            if fresh_excerpt is None:
                continue
            lines[ex.start:ex.end] = fresh_excerpt
            changed += 1
            continue
        fresh = [ln.rstrip() for ln in actual]
        while fresh and not fresh[-1]:
            fresh.pop()
        lines[ex.start:ex.end] = fresh
        changed += 1
    if changed:
        page.write_text("\n".join(lines))
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the outputs that differ")
    args = parser.parse_args()
    stale = 0
    for page in PAGES:
        results = check_page(page)
        for ex, _, diff in results:
            if diff:
                stale += 1
                print(f"{ex.where}: {diff}")
        if args.write:
            n = write(page, results)
            if n:
                print(f"rewrote {n} example(s) in {page.relative_to(ROOT)}")
    print(f"{stale} example(s) differ")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
