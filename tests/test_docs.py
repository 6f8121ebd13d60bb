"""The docs do what they say: links resolve, ``profctx`` commands run, Python snippets run.

Checked in README.md, docs/**/*.md and the comments of docs/examples/*.yaml:

- every relative link (and its ``#anchor``) points at a file (and a heading) that exists;
- every ``profctx ...`` command runs with exit code 0 and no traceback, in a folder holding real
  captures (steps 1-4, roles ``rollout`` and ``actor_update``) and the example configs. A usage
  line (``profctx ls DIR [--step S]``) is checked against the subcommand's ``--help`` instead, and a
  bare ``profctx ls`` names a subcommand that must exist;
- every Python snippet runs, in a fresh namespace where ``profctx`` is imported (the pages assume
  it), in a scratch working folder.

What cannot run here is listed in ``NOT_RUNNABLE`` with the reason; what is broken in a page this
test's owner does not maintain is listed in ``KNOWN_FAILURES`` and expected to fail (strictly:
once fixed, the entry must go). Every entry must match something, so none goes stale.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

import profctx
from profctx.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.yaml"))

#: (page, text the snippet or command contains) -> why it cannot run in this test.
NOT_RUNNABLE: dict[tuple[str, str], str] = {
    ("README.md", "for step in range(1, total + 1)"):
        "an outline: total, rollout, prompts and actor stand for the reader's training loop",
    ("docs/cli.md", "from hta.trace_analysis import TraceAnalysis"):
        "HTA is the optional test group 'hta' (tests/cli/test_hta_layout.py runs this when installed)",
    ("docs/distributed.md", "class Trainer:"):
        "starts a Ray cluster and two actors (it runs as written, in about 15 s); tests/ray runs the same pattern",
    ("docs/distributed.md", "ranks={\"actor\": [0, 1], \"rollout\": \"all\"}"):
        "a fragment of configure(); tests/ray/test_ray.py selects per group the same way",
    ("docs/distributed.md", "pool.submit(profctx.bind(fn), x)"):
        "a fragment: pool, fn, x and an event loop are the reader's",
    ("docs/engines.md", "VLLMHttpAdapter(\"http://rollout-0:8000\""):
        "needs running vLLM servers at rollout-0 and rollout-1",
    ("docs/engines.md", "s = launch_settings(version="):
        "an excerpt: the comments show attributes, and it needs a configuration set up elsewhere",
    ("docs/engines.md", "profctx.attach(VLLMAsyncAdapter(async_llm))"):
        "needs an in-process vLLM AsyncLLM (vLLM is not installed here)",
    ("docs/engines.md", "class RolloutServer(EngineProfilingMixin):"):
        "needs Ray and vLLM engine servers",
    ("docs/migrating-from-verl.md", "profctx.configure(verl=cfg)"):
        "cfg is the reader's verl trainer config; tests/interop converts the same shapes",
    ("docs/migrating-from-verl.md", "class ActorRolloutRefWorker(Worker, DistProfilerExtension):"):
        "verl's own worker code, shown for comparison (verl is not a dependency)",
    ("docs/migrating-from-verl.md", "class ActorRolloutRefWorker(Worker):"):
        "an outline of a verl worker: Worker, register and the dispatch function are verl's",
    ("docs/migrating-from-verl.md", "profctx.ray.group(\"actor_ref\", wg_dict.workers)"):
        "needs a Ray cluster and verl's worker classes; tests/interop/test_verl_ray.py runs it as written",
    ("docs/migrating-from-verl.md", "@hydra.main("):
        "a Hydra application: needs conf/config.yaml and a command line; tests/interop composes it",
    ("docs/performance.md", "profctx merge --step 1"):
        "shorthand in prose for the benchmark's command; the folder argument is left out",
    ("docs/performance.md", "profctx summary --json"):
        "shorthand in prose for the benchmark's command; the folder argument is left out",
    ("docs/migrating-from-verl.md", "examples/profile/"):
        "a path in verl's repository (copied under tests/interop/fixtures, with its source named)",
    ("docs/migrating-from-verl.md", "docs/perf/nsight_profiling.md"):
        "a page of verl's repository (copied under tests/interop/fixtures, with its source named)",
    ("docs/analysis.md", "./profctx-demo"): "needs the demo's output (profctx demo starts a Ray cluster)",
    ("docs/analysis.md", "./base"): "needs two runs of the reader's program, a baseline and a new one",
    ("docs/analysis.md", "BASE_DIR NEW_DIR"): "a usage line whose folders are the reader's two runs",
    ("docs/analysis.md", "from profctx.analysis import summarize, diff, check"):
        "reads the reader's runs; tests/cli and tests/analysis run the same calls on real captures",
    ("docs/cli.md", "profctx captures"): "the name of a process row in a merged trace, not a command",
    ("docs/examples/", "profctx verl-convert ppo_trainer @docs/examples/"):
        "needs verl's trainer configs (the verl extra); tests/interop regenerates every example this way",
}

#: (page, text) -> what is wrong, for pages kept by others: expected to fail until fixed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {
}


# -- extraction -------------------------------------------------------------------------------

_FENCE = re.compile(r"^([ \t]*)```([\w-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE = re.compile(r"`([^`\n]+)`")
_SHELL = {"bash", "sh", "shell", "console", ""}


@dataclass(frozen=True)
class Item:
    """One thing a page claims: a link, a command or a snippet, with where it is."""

    page: str
    line: int
    text: str

    @property
    def id(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return f"{self.page}:{self.line}:{first[:50]}"


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _fences(text: str) -> Iterator[tuple[str, str, int]]:
    for match in _FENCE.finditer(text):
        yield match.group(2), textwrap.dedent(match.group(3)), _line_of(text, match.start()) + 1


def _prose(text: str) -> str:
    """Return ``text`` with fenced blocks blanked (line numbers kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def links() -> list[Item]:
    out = []
    for page in PAGES:
        text = _prose(page.read_text(encoding="utf-8"))
        for match in _LINK.finditer(text):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
                out.append(Item(_rel(page), _line_of(text, match.start()), target))
    return out


def snippets() -> list[Item]:
    return [Item(_rel(page), line, body) for page in PAGES
            for lang, body, line in _fences(page.read_text(encoding="utf-8")) if lang == "python"]


def commands() -> list[Item]:
    """Return every ``profctx ...`` command line the docs show: in shell blocks, inline, in example comments."""
    return [item for page in [*PAGES, *EXAMPLES]
            for item in commands_in(_rel(page), page.read_text(encoding="utf-8"), markdown=page.suffix == ".md")]


def commands_in(page: str, text: str, *, markdown: bool) -> list[Item]:
    """Return the ``profctx ...`` commands in one page (a YAML example: in its comments' code spans)."""
    out = []
    for lang, body, line in _fences(text) if markdown else ():
        if lang not in _SHELL:
            continue
        for i, raw in enumerate(body.splitlines()):
            stripped = raw.strip()
            prompted = stripped.startswith("$ ")
            command = stripped[2:] if prompted else stripped
            # In a block with "$ " prompts, unprompted lines are output ("profctx ls: skipped ...").
            if command.startswith("profctx ") and (prompted or "$ " not in body):
                out.append(Item(page, line + i, command.split("  #")[0].strip()))
    prose = _prose(text) if markdown else text
    for match in _INLINE.finditer(prose):
        if match.group(1).startswith("profctx "):
            out.append(Item(page, _line_of(prose, match.start()), match.group(1)))
    return out


_FILE_REFERENCE = re.compile(r"(?:\./)?(?:docs|tests|profctx|benchmarks|\.ci|examples)/[\w./-]+|[\w-]+\.md")


def file_references() -> list[Item]:
    """Return repository paths named in code spans (`docs/manifest.md`): a reference is a link too."""
    out = []
    for page in PAGES:
        text = _prose(page.read_text(encoding="utf-8"))
        for match in _INLINE.finditer(text):
            if _FILE_REFERENCE.fullmatch(match.group(1)):
                out.append(Item(_rel(page), _line_of(text, match.start()), match.group(1)))
    return out


def _marked(item: Item, table: dict[tuple[str, str], str]) -> str | None:
    for (page, needle), reason in table.items():
        if (page == item.page or (page.endswith("/") and item.page.startswith(page))) and needle in item.text:
            return reason
    return None


def _params(items: list[Item]) -> list[object]:
    params = []
    for item in items:
        marks = []
        if (reason := _marked(item, NOT_RUNNABLE)) is not None:
            marks.append(pytest.mark.skip(reason=f"not runnable here: {reason}"))
        elif (reason := _marked(item, KNOWN_FAILURES)) is not None:
            marks.append(pytest.mark.xfail(reason=f"known failure: {reason}", strict=True))
        params.append(pytest.param(item, id=item.id, marks=marks))
    return params


# -- links ------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """Return the anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _prose(page.read_text(encoding="utf-8"))
    slugs: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug, n = _slug(heading), 1
        while slug in slugs:  # repeated headings get -1, -2, ...
            slug = f"{_slug(heading)}-{n}"
            n += 1
        slugs.add(slug)
    return slugs


@pytest.mark.parametrize("link", _params(links()))
def test_relative_link_resolves(link: Item) -> None:
    path_part, _, anchor = link.text.partition("#")
    source = ROOT / link.page
    target = (source.parent / path_part).resolve() if path_part else source
    assert target.exists(), f"{link.page}:{link.line}: {link.text} -> {target} does not exist"
    if anchor and target.suffix == ".md":
        assert anchor in _anchors(target), f"{link.page}:{link.line}: no heading #{anchor} in {_rel(target)}"


@pytest.mark.parametrize("reference", _params(file_references()))
def test_file_named_in_code_exists(reference: Item) -> None:
    page = ROOT / reference.page
    candidates = (ROOT / reference.text, page.parent / reference.text)
    assert any(c.exists() for c in candidates), f"{reference.page}:{reference.line}: {reference.text} does not exist"


# -- commands ---------------------------------------------------------------------------------


def _subcommands() -> list[Item]:
    from profctx.cli import COMMANDS

    return [Item("docs/cli.md", 0, f"section for profctx {name}") for name in COMMANDS]


@pytest.mark.parametrize("subcommand", _params(_subcommands()))
def test_every_subcommand_has_a_section_in_cli_md(subcommand: Item) -> None:
    # README promises docs/cli.md documents every subcommand.
    headings = re.findall(r"^#+ .*$", (ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), re.M)
    name = subcommand.text.removeprefix("section for profctx ")
    assert any(f"profctx {name}`" in h for h in headings), f"docs/cli.md has no section for profctx {name}"



@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder with real captures in ./profiles and the example configs the docs name."""
    folder = tmp_path_factory.mktemp("docs")
    for example in EXAMPLES:
        shutil.copy(example, folder / example.name)
    (folder / "profctx.yaml").write_text("steps: '3:6'\ntool: nsys\n")  # the reader's own nsys config
    profctx.configure(steps="1:5", mode="role", save_path=folder / "profiles", warmup=False, exit_hooks=False)
    try:
        for step in range(1, 6):
            with profctx.profile_step(step):
                with profctx.profile_step(role="rollout"):
                    sum(range(1000))
                with profctx.profile_step(role="actor_update"):
                    sum(range(1000))
        assert profctx.flush(60)
    finally:
        profctx.reset()
    return folder


def _run_cli(argv: list[str], cwd: Path) -> tuple[int, str]:
    out = io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(previous)
    return code, out.getvalue()


_USAGE = re.compile(r"\b[A-Z]{2,}\b|\[|\||\.\.\.")


@pytest.mark.parametrize("command", _params(commands()))
def test_profctx_command_runs(command: Item, workdir: Path) -> None:
    argv = shlex.split(command.text)[1:]
    if len(argv) == 1 or _USAGE.search(command.text):
        # A bare subcommand name, or a usage line: the subcommand exists and knows every option shown.
        code, help_text = _run_cli([argv[0], "--help"], workdir)
        assert code == 0, f"{command.id}: 'profctx {argv[0]} --help' exited {code}:\n{help_text}"
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", command.text):
            for part in option.split("/"):
                assert part in help_text, f"{command.id}: {part} is not an option of 'profctx {argv[0]}'"
        return
    code, output = _run_cli(argv, workdir)
    assert "Traceback" not in output, f"{command.id}:\n{output}"
    assert code == 0, f"{command.id}: exited {code}:\n{output}"


# -- snippets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("snippet", _params(snippets()))
def test_python_snippet_runs(snippet: Item, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__doc_snippet__", "profctx": profctx}
    code = compile(snippet.text, f"{snippet.page}:{snippet.line}", "exec")
    try:
        exec(code, namespace)  # running the docs is the point
    finally:
        profctx.reset()


# -- YAML ---------------------------------------------------------------------------------------


def yaml_texts() -> list[Item]:
    """Return the example config files and the YAML blocks of the pages."""
    out = [Item(_rel(p), 1, p.read_text(encoding="utf-8")) for p in EXAMPLES]
    for page in PAGES:
        out += [Item(_rel(page), line, body) for lang, body, line in _fences(page.read_text(encoding="utf-8"))
                if lang in ("yaml", "yml")]
    return out


#: YAML shown on purpose with an unquoted slice, to say what it means.
UNQUOTED_ON_PURPOSE: Final = {("docs/configuration.md", "steps: 3:6          # steps 3, 4, 5 through profctx")}


@pytest.mark.parametrize("block", [pytest.param(i, id=i.id) for i in yaml_texts()])
def test_yaml_in_docs_means_the_same_to_every_reader(block: Item) -> None:
    # Readers copy these into Hydra/OmegaConf too, where an unquoted 3:6 becomes 186.
    import yaml

    from profctx.core._config import yaml_load

    try:
        plain = yaml.safe_load(block.text)
    except yaml.YAMLError:
        pytest.skip("not a YAML document on its own (side-by-side comparison)")
    if any(page == block.page and needle in block.text for page, needle in UNQUOTED_ON_PURPOSE):
        assert plain != yaml_load(block.text)
        return
    assert plain == yaml_load(block.text), f"{block.id}: quote the slices ('3:6'): YAML 1.1 reads them as numbers"


# -- the allow-lists stay honest --------------------------------------------------------------


def test_every_allow_list_entry_matches_something() -> None:
    items = [*snippets(), *commands(), *links(), *file_references(), *_subcommands(), *yaml_texts()]
    for table in (NOT_RUNNABLE, KNOWN_FAILURES, dict.fromkeys(UNQUOTED_ON_PURPOSE, "")):
        for page, needle in table:
            assert any(_marked(i, {(page, needle): ""}) is not None for i in items), f"stale entry: {page}: {needle!r}"


def test_the_checks_find_what_they_look_for() -> None:
    pages = {i.page for i in snippets()}
    assert {"docs/quickstart.md", "docs/configuration.md"} <= pages
    assert any(i.text == "profctx ls profiles" for i in commands())
    assert any(i.text.startswith("profctx ls DIR") for i in commands())  # a usage line
    assert not any(i.text.startswith("profctx ls: skipped") for i in commands())  # output, not a command
    example = "# made by `profctx nsys-command --config x.yaml -- python t.py`.\nsteps: [1]\n"
    assert [i.text for i in commands_in("x.yaml", example, markdown=False)] == [
        "profctx nsys-command --config x.yaml -- python t.py"]
    assert any(i.text.startswith("examples/profile/") for i in file_references())
    assert any(i.text.startswith("concepts.md#") for i in links())
