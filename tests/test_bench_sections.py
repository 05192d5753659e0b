"""``make bench`` (benchmarks/run.py) knows how to regenerate every section of
benchmarks/RESULTS.md: each ``## N.`` heading has an entry in ``sections.SECTIONS``, whose
scripts exist and whose in-process benchmark has its ``--skip-*`` flag. Nothing is run."""

import pathlib
import re
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import sections as S  # noqa: E402


def headings() -> dict[int, str]:
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    return {int(n): title for n, title in re.findall(r"^## (\d+)\. (.*)$", text, re.M)}


def test_every_section_of_results_has_a_command():
    found = headings()
    assert found, "RESULTS.md has no numbered sections"
    assert sorted(found) == sorted(S.SECTIONS), (sorted(found), sorted(S.SECTIONS))
    for number, title in found.items():
        # the heading names the same benchmark (titles may be longer in the file)
        assert title.startswith(S.SECTIONS[number].title[:30]), (number, title)


@pytest.mark.parametrize("number", sorted(S.SECTIONS))
def test_each_section_is_run_in_process_or_by_existing_scripts(number):
    section = S.SECTIONS[number]
    assert section.in_process or section.commands
    run_py = (BENCH / "run.py").read_text(encoding="utf-8")
    if section.in_process:
        assert f'"--skip-{section.in_process}"' in run_py
        assert f'"## {number}. ' in run_py  # the heading run.py writes
    for cmd in section.commands:
        assert (BENCH / cmd.script).is_file(), cmd.script
        assert cmd.argv(quick=False)[0] == f"benchmarks/{cmd.script}"


def test_a_section_keeps_its_analysis_and_replaces_only_its_generated_block():
    old = "## 9. The zoo sharded\n\nanalysis of the run of May\n"
    first = S.insert_block(9, old, f"{S.BEGIN}\nrun 1\n{S.END}")
    assert first == f"## 9. The zoo sharded\n\n{S.BEGIN}\nrun 1\n{S.END}\n\nanalysis of the run of May\n"
    second = S.insert_block(9, first, f"{S.BEGIN}\nrun 2\n{S.END}")
    assert second == first.replace("run 1", "run 2")
    head, body = S.split("# title\n\nintro\n\n" + second + "## 10. next\n\ntext\n")
    assert head == "# title\n\nintro\n\n" and sorted(body) == [9, 10]
    assert body[9] == second and body[10] == "## 10. next\n\ntext\n"
