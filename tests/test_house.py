"""The source reads as a reference, not a diary: no work sessions, issue numbers or dates in the package's code,
and every script it cites exists (the history, and the scripts since removed, live in git)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "napari_gridmip"

# "the fourteenth session", "session 18", "issue 53", "#53", "2026-12-07": each ages the moment it is written. A
# user's session ("the first Run of a session", "the next session") is the program's own word and stays.
ORDINALS = (
    "third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth"
    "|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)"
)
DIARY = re.compile(
    rf"\b(?:{ORDINALS})\s+(?:work\s+)?sessions?\b|\bsessions?\s+\d+\b|\bissues?\s+#?\d+|(?<![\w&#])#\d+\b"
    r"|\b\d{4}-\d\d-\d\d\b",
    re.IGNORECASE,
)
# a script of the repository named in the source: ``benchmarks/bench_dic.py``, tools/accelerator_probe.py
SCRIPT = re.compile(r"\b((?:benchmarks|tools)/[\w/]+\.py)\b")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def diary_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if DIARY.search(line)]


def test_the_diary_pattern():
    assert len(diary_lines("measured in the eighteenth session\nsee issue 53\nas in #12\non 2026-12-07")) == 4
    assert len(diary_lines("the 14th session\nsession 18 measured")) == 2
    assert diary_lines("a user's first session compiles; the next session reads the cache") == []
    assert len(diary_lines("a\nissue #7, item 2\nb")) == 1
    assert diary_lines("colour = '#ff0000'  # 8 bits\nx[#1] is not code\nversion 2.16, 3 issues") == [
        "x[#1] is not code"
    ]


def test_no_session_issue_or_date_references():
    found = [f"{path.relative_to(ROOT)}: {line}" for path in sources() for line in diary_lines(path.read_text())]
    assert found == [], "\n".join(found)


def test_every_cited_script_exists():
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {script}"
            for path in sources()
            for script in SCRIPT.findall(path.read_text())
            if not (ROOT / script).is_file()
        }
    )
    assert missing == [], "\n".join(missing)
