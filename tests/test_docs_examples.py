"""Every `$ planner …` example in README.md and docs/ prints today what the page shows (tests/docs_examples.py;
`python tests/docs_examples.py --write` brings the pages up to date)."""

import pytest

from tests.docs_examples import PAGES, ROOT, check_page, examples


def test_the_pages_hold_examples_of_every_command():
    commands = {ex.argv[0] for page in PAGES for ex in examples(page)}
    assert commands >= {"memory", "estimate", "plan", "launch", "validate", "sweep", "presets"}


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_print_what_the_page_shows(page):
    stale = [f"{ex.where}: {diff}" for ex, _, diff in check_page(page) if diff]
    assert not stale, "\n".join(stale) + "\n(python tests/docs_examples.py --write rewrites them)"


def test_the_check_sees_a_changed_number_and_an_excerpt_out_of_order(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```text\n$ planner memory llama-3.1-8b --cluster dgx-h100 --gpus 8 --tp 3\n"
                    "error: tp(3)·pp(1)·cp(1) = 4 does not divide gpus(8)\n```\n")
    [(ex, actual, diff)] = check_page(page)
    assert ex.argv[:2] == ["memory", "llama-3.1-8b"] and "= 4 does not divide" in diff
    assert actual[0] == "error: tp(3)·pp(1)·cp(1) = 3 does not divide gpus(8)"
    page.write_text("```text\n$ planner presets\n```\n")
    [(_, run_lines, _)] = check_page(page)
    first, later = run_lines[0].rstrip(), next(ln.rstrip() for ln in run_lines if ln.startswith(" llama-3.1-8b "))
    for shown, in_order in (([first, "...", later], True), ([later, "...", first], False)):
        page.write_text("```text\n$ planner presets\n" + "\n".join(shown) + "\n```\n")
        [(ex, _, diff)] = check_page(page)
        assert ex.excerpt and (diff is None) == in_order, diff


def test_write_renews_an_excerpts_numbers_and_leaves_one_whose_lines_are_gone(tmp_path):
    from tests.docs_examples import write

    page = tmp_path / "page.md"
    page.write_text("```text\n$ planner presets\n```\n")
    [(_, run_lines, _)] = check_page(page)
    row = next(ln.rstrip() for ln in run_lines if ln.startswith(" llama-3.1-8b "))
    stale_row = row.replace("4096", "4097", 1)
    assert stale_row != row
    page.write_text("```text\n$ planner presets\n...\n" + stale_row + "\n```\n")
    assert write(page, check_page(page)) == 1
    assert page.read_text() == "```text\n$ planner presets\n...\n" + row + "\n```\n"
    # a shown line that reads differently but for its numbers is not guessed at: the page is left as it is
    gone = "```text\n$ planner presets\n...\n no-such-model 1 2 3\n```\n"
    page.write_text(gone)
    assert write(page, check_page(page)) == 0 and page.read_text() == gone


def test_cat_shows_a_file_an_earlier_example_wrote(tmp_path):
    launch = "$ planner launch llama-3.1-8b --cluster dgx-h100 --gpus 8 --tp 8 --framework megatron --out /tmp/l8\n"
    head = "# Launch: llama-3.1-8b on 8x H100-SXM (megatron)"
    page = tmp_path / "page.md"
    for shown, stale in ((head, False), (head.replace("8x", "16x"), True), ("tp 8 (sp), pp 2", True)):
        page.write_text("```text\n" + launch + "wrote 3 files to /tmp/l8: README.md, plan.json, train.sh\n"
                        "$ cat /tmp/l8/README.md\n" + shown + "\n...\n```\n")
        [(ex_launch, _, launch_diff), (ex_cat, _, diff)] = check_page(page)
        assert launch_diff is None and ex_cat.argv == ["cat", "/tmp/l8/README.md"] and ex_cat.excerpt
        assert (diff is not None) == stale, diff
    # a file no example wrote is not there
    page.write_text("```text\n$ cat /tmp/nowhere/README.md\n" + head + "\n```\n")
    [(_, actual, diff)] = check_page(page)
    assert actual == ["cat: /tmp/nowhere/README.md: No such file or directory"] and diff
