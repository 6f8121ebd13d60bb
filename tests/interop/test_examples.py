"""docs/examples holds verl 0.9.1's own example configs (Hydra overrides of its ppo_trainer config, taken
from its example scripts and docs) and their converted profctx configs; docs/migrating-from-verl.md
shows each with the output of `profctx verl-convert`. These tests regenerate all of it from the real
verl and compare, so every example is a real verl config converted by a test."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import profctx
from profctx.cli import main

from .conftest import EXAMPLES
from .verl_inputs import FIXTURES, script_overrides

pytestmark = pytest.mark.usefixtures("verl_wheel")
DOC = EXAMPLES.parent / "migrating-from-verl.md"
START, END = "<!-- examples:start -->", "<!-- examples:end -->"

#: case -> (title, the verl example it is, the verl script and environment it comes from, if a script)
CASES: dict[str, tuple[str, str, tuple[str, dict[str, str]] | None]] = {
    "torch-whole-step": (
        "torch, whole step, with vLLM rollout engines",
        "verl's `examples/profile/run_qwen2_5_7b_torch_profile.sh` with its defaults: training continuous "
        "(one trace per step), the vLLM rollout discrete (verl drives its engines only then).",
        ("run_qwen2_5_7b_torch_profile.sh", {})),
    "torch-discrete": (
        "torch, one trace per stage",
        "the same script with `PROFILE_DISCRETE=True`.",
        ("run_qwen2_5_7b_torch_profile.sh", {"PROFILE_DISCRETE": "True"})),
    "npu-discrete": (
        "Ascend NPU, one trace per stage",
        "verl's `examples/profile/run_qwen3_8b_npu_profile_discrete.sh` with its defaults.",
        ("run_qwen3_8b_npu_profile_discrete.sh", {})),
    "torch-memory": (
        "torch_memory",
        "verl's `examples/profile/run_qwen2_5_vl_7b_torch_memory.sh`: no steps, so verl takes no per-step "
        "snapshot, but its tool still records memory history and OOM snapshots in every worker.",
        ("run_qwen2_5_vl_7b_torch_memory.sh", {})),
    "nsys": (
        "Nsight Systems",
        "the example of verl's `docs/perf/nsight_profiling.md` (relocation and an upload hook, every actor "
        "rank), as overrides.",
        None),
    "nsys-discrete": (
        "Nsight Systems, one capture range per stage",
        "the same with `global_profiler.global_tool_config.nsys.discrete=True` (the docs' \"multiple databases\" "
        "example writes `profiler.discrete`, a key verl refuses).",
        None),
}
#: nsys examples -> the nsys-command arguments shown for them (verl 0.9's actor worker enters these stages).
NSYS = {
    "nsys": [],
    "nsys-discrete": ["--step-roles", "actor_compute_log_prob,ref_compute_log_prob,actor_update"],
}


def _cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert code == 0, err.getvalue()
    return out.getvalue()


def _args(case: str) -> list[str]:
    text = (EXAMPLES / f"verl-{case}.args").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def render_section() -> str:
    """Return the examples section of docs/migrating-from-verl.md, from the real verl and the CLI."""
    parts = [START, ""]
    for case, (title, what, _) in CASES.items():
        args = "\n".join(_args(case))
        converted = _cli("verl-convert", "ppo_trainer", f"@docs/examples/verl-{case}.args")
        parts += [f"### {title}", "", f"[`verl-{case}.args`](examples/verl-{case}.args): {what}", "",
                  "```text", args, "```", "",
                  "```text", f"$ profctx verl-convert ppo_trainer @docs/examples/verl-{case}.args",
                  converted.rstrip("\n"), "```", ""]
        if case in NSYS:
            command = _cli("nsys-command", "--config", f"docs/examples/profctx-{case}.yaml", *NSYS[case], "--",
                           "python", "-m", "verl.trainer.main_ppo")
            shown = " ".join(NSYS[case])
            parts += ["```text", f"$ profctx nsys-command --config docs/examples/profctx-{case}.yaml "
                      f"{shown + ' ' if shown else ''}-- python -m verl.trainer.main_ppo",
                      command.rstrip("\n"), "```", ""]
    parts.append(END)
    return "\n".join(parts)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parents[1])  # the paths shown in the doc are relative to the repository


def test_every_example_is_tested() -> None:
    names = sorted(p.name for p in EXAMPLES.iterdir())
    expected = sorted([f"verl-{c}.args" for c in CASES] + [f"profctx-{c}.yaml" for c in CASES] + ["profctx-hydra.yaml"])
    assert names == expected


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if v[2] is not None])
def test_the_verl_examples_are_verl_scripts_overrides(case: str) -> None:
    """Each script example holds exactly the profiling overrides of verl's own script (fixtures/verl_0.9)."""
    script, env = CASES[case][2]  # type: ignore[misc]
    assert _args(case) == list(script_overrides((FIXTURES / script).read_text(encoding="utf-8"), env))


def test_the_nsys_example_is_the_one_of_verls_docs() -> None:
    """The nsys overrides compose to the same profiler config as the YAML example of verl's nsight doc."""
    from omegaconf import OmegaConf

    from .verl_inputs import Input, compose, doc_inputs

    doc = next(i for i in doc_inputs() if i.name == "nsight_profiling#0")
    ours = compose(Input("nsys", "ppo_trainer", tuple(_args("nsys"))))
    theirs = compose(doc)
    for key in ("global_profiler", "actor_rollout_ref"):
        assert OmegaConf.to_container(ours[key], resolve=True) == OmegaConf.to_container(theirs[key], resolve=True)


@pytest.mark.parametrize("case", list(CASES))
def test_the_profctx_example_is_the_converted_verl_example(case: str) -> None:
    from profctx.interop.verl import convert

    from .verl_inputs import Input, compose

    converted = convert(compose(Input(case, "ppo_trainer", tuple(_args(case))))).config
    loaded = profctx.ProfilerConfig.from_mapping(
        __import__("yaml").safe_load((EXAMPLES / f"profctx-{case}.yaml").read_text(encoding="utf-8")))
    assert loaded == converted


def test_the_doc_shows_each_example_with_its_conversion_report() -> None:
    text = DOC.read_text(encoding="utf-8")
    shown = text[text.index(START):text.index(END) + len(END)]
    assert shown == render_section(), "regenerate it: PYTHONPATH=.:tests python -m interop.test_examples"


@pytest.mark.parametrize("case", list(NSYS))
def test_the_nsys_repeat_count_is_the_ranges_the_converted_config_opens(case: str, tmp_path: Path) -> None:
    """capture-range-end=repeat:N in the doc equals the captures the converted config opens over verl 0.9's
    stages (a hybrid actor worker enters actor_compute_log_prob, ref_compute_log_prob, actor_update)."""
    from profctx.testing import capture

    text = DOC.read_text(encoding="utf-8")
    block = text[text.index(f"--config docs/examples/profctx-{case}.yaml"):]
    repeat = int(re.search(r"capture-range-end=repeat:(\d+)", block).group(1))  # type: ignore[union-attr]
    config = profctx.ProfilerConfig.from_mapping(
        __import__("yaml").safe_load((EXAMPLES / f"profctx-{case}.yaml").read_text(encoding="utf-8")))
    fields = config.replace(ranks=(0,), rank=0, world_size=1, save_path=str(tmp_path)).to_dict()
    with capture(**fields) as captured:
        for step in range(1, 7):
            with profctx.profile_step(step):
                for stage in ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update"):
                    with profctx.profile_step(role=stage):
                        pass
        profctx.flush(30)
    assert len([c for c in captured if c.status == "ok"]) == repeat


def test_hydra_example_loads_through_configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = profctx.configure(EXAMPLES / "profctx-hydra.yaml", warmup=False)
    assert config is not None
    assert list(config.steps or ()) == [10, 20, 30]
    assert config.mode == "role" and config.roles == ("actor_*", "rollout") and config.engines.count == 20


if __name__ == "__main__":  # regenerate the doc section
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text[:text.index(START)] + render_section() + text[text.index(END) + len(END):], encoding="utf-8")
