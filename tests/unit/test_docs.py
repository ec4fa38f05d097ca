"""The documentation's relative links resolve, and no tracked file speaks of the
circumstances the project was built in rather than of the product."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

#: ``[text](target)``, not an image's; the target up to a space or the closing bracket.
INLINE_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: A reference definition: ``[label]: target``.
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def linked_pages() -> list[Path]:
    """The pages whose links a reader follows: the README, every doc, the benchmarks'
    README and the results index (absent from an unpacked sdist)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "benchmarks" / "README.md", *sorted(ROOT.glob("benchmarks/*/INDEX.md"))]
    return [page for page in pages if page.is_file()]


def prose_lines(text: str, code_spans: bool = False) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked unless
    ``code_spans``."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line if code_spans else re.sub(r"(`+).*?\1", "", line))
    return lines


def links(text: str) -> list[str]:
    found = []
    for line in prose_lines(text):
        found += INLINE_LINK.findall(line)
        if match := REFERENCE_LINK.match(line):
            found.append(match.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lowercased, without punctuation
    (hyphens and underscores stay), spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)  # emphasis markers
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8"), code_spans=True):
        if match := HEADING.match(line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def pruned_from_the_sdist() -> list[Path]:
    """The folders MANIFEST.in leaves out of the sdist: links into them resolve in a
    clone and are skipped where the folder is not there."""
    manifest = ROOT / "MANIFEST.in"
    if not manifest.is_file():
        return []
    return [ROOT / line.split(None, 1)[1].strip().rstrip("/")
            for line in manifest.read_text().splitlines() if line.startswith("prune ")]


def broken_links(page: Path) -> list[str]:
    """``page``'s relative links that name no file, or a heading its target lacks."""
    broken = []
    absent = [folder for folder in pruned_from_the_sdist() if not folder.exists()]
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if any(resolved == folder or folder in resolved.parents for folder in absent):
            continue
        where = f"{page.relative_to(ROOT)}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor:
            if resolved.suffix != ".md" or not resolved.is_file():
                broken.append(f"{where} (an anchor into a page that is not markdown)")
            elif anchor.lower() not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_of_the_docs_resolves():
    pages = linked_pages()
    assert ROOT / "README.md" in pages and len(pages) > 3, pages
    assert sum(len(links(p.read_text(encoding="utf-8"))) for p in pages) > 20, \
        "the pages link almost nothing; this test reads them wrongly"
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_file_a_broken_anchor_and_code_spans(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# A `code` heading: with, punctuation\n\n## Twice\n## Twice\n")
    page.write_text("[ok](other.md#a-code-heading-with-punctuation) [ok](other.md#twice-1)\n"
                    "[gone](missing.md) [bad](other.md#nowhere) `[code](not-a-link.md)`\n"
                    "[ref]: other.md#twice\n```\n[fenced](not-a-link.md)\n```\n")
    found = links(page.read_text())
    assert found == ["other.md#a-code-heading-with-punctuation", "other.md#twice-1",
                     "missing.md", "other.md#nowhere", "other.md#twice"]
    assert anchors(tmp_path / "other.md") == {"a-code-heading-with-punctuation", "twice",
                                              "twice-1"}
    assert slug("The `plan` command: PP *or* TP?") == "the-plan-command-pp-or-tp"
    assert slug("VLLM_PP_CUDAGRAPH_STALL_LIMIT_S") == "vllm_pp_cudagraph_stall_limit_s"


#: Words of the workplace the project was built in, not of the product: the time and
#: machines a run was given, and the rounds of work. Precise enough to leave vLLM's and
#: Ray's logs (a pytest "test session", Ray's "session_..." folders and "Lease ID"), an
#: HTTP client session and a token budget alone.
WORKPLACE = re.compile("|".join(pattern.replace(" ", r"\s+") for pattern in [
    r"\bdevice[- ]time\b",
    r"\bdevice[- ]minutes?\b",
    r"\blease[sd]?\b(?! id\b)",
    r"\b(?:time|device|gpu|session'?s?) budget\b",
    r"\bbudget_left\b",
    r"\bsessions\b",
    r"\bsession's\b",
    r"\b(?:a|the|this|that|one|each|later|next|same|whole|fresh|new|another|previous|"
    r"its own) session\b(?! (?:starts|fixture|scope|id\b))",
    r"\b(?:machines?|hosts?|kinds?|gpus?) (?:(?:was|were|is|are) )?lent\b",
    r"\blent (?:machine|host)s?\b",
    r"\bavailable to this project\b",
    r"\bheld machine\b",
    r"\btime ran out\b",
    r"\b(?:machine|host) (?:was |is )?(?:given|taken|went) back\b",
]), re.IGNORECASE)


def workplace_words(text: str) -> list[tuple[int, str]]:
    """Each hit with its line number; a phrase may wrap over lines."""
    return [(text.count("\n", 0, match.start()) + 1, " ".join(match.group(0).split()))
            for match in WORKPLACE.finditer(text)]


def tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone: no tracked files to read")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                            capture_output=True).stdout.decode().split("\0")
    files = []
    for name in filter(None, listed):
        path = ROOT / name
        if path == Path(__file__) or not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head or head[:2] == b"\x1f\x8b":  # binary, or gzip
            continue
        files.append(path)
    return files


def test_no_tracked_file_speaks_of_the_workplace():
    hits = []
    for path in tracked_text_files():
        text = path.read_bytes().decode("utf-8", errors="replace")
        hits += [f"{path.relative_to(ROOT)}:{n}: {word}" for n, word in workplace_words(text)]
    assert not hits, "words of the workplace, not of the product:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "the device time ran out", "23 device-minutes", "a short lease keeps it",
    "the time budget went to the serving", "it takes several sessions",
    "in the session's remaining time", "a machine of its own, in a session of its own",
    "no 2-GPU kind was lent", "the GPU machines available to this project",
    "timer since the previous session", "the machine was given back mid-run",
    "where a machine\n  is lent for less time",
])
def test_the_workplace_check_sees_its_words(line):
    assert workplace_words(line)


@pytest.mark.parametrize("line", [
    "======================== test session starts ========================",
    "--session-dir=/tmp/ray/session_2026-11-28_12-48", "Lease ID: 01000000812e",
    "async with aiohttp.ClientSession() as session:", '@pytest.fixture(scope="session")',
    "'encoder_cudagraph_token_budgets': []", "layers it can hold within ``budget_s``",
    "graphs_in_budget", "the release that installs", "vLLM's compile cache",
])
def test_the_workplace_check_leaves_code_and_logs_alone(line):
    assert workplace_words(line) == []
