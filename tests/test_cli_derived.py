"""The command line derived from the registry: every chapter's ``--profile``, ``--part`` and ``--set FIELD=VALUE`` (one
parser, typed and checked by the profile's dataclass), and the flags every chapter shares. Nothing expensive runs: a
chapter's ``runs`` is replaced by one that records what it was asked for."""
from __future__ import annotations

import json

import pytest

from depthlib import chapters, cli, paths, settings
from depthlib.errors import InputError


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = [ln for ln in captured.err.splitlines() if ln.strip() and not ln.startswith("[depthlib]")]
    assert len(lines) == 1, captured.err
    return lines[0]


class _Run:
    """What a chapter's runs() returns, as far as the command looks at it."""

    committed = True

    def __init__(self, path):
        self.path = path


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Replace a chapter's ``runs`` (and ``summary``) by recorders; returns the calls: [(profile, kwargs)]."""
    (tmp_path / "manifest.json").write_text("{}")
    calls: list[tuple] = []

    def record(name: str, parts=("main",)):
        module = chapters.by_name(name).module

        def runs(profile, **kwargs):
            calls.append((profile, kwargs))
            return {part: _Run(tmp_path) for part in (kwargs.get("parts") or parts)}
        monkeypatch.setattr(module, "runs", runs)
        monkeypatch.setattr(module, "summary", lambda run: {"summarised": True})
        return calls
    return record


# ---- --profile: the runs the chapter's notebook shows -----------------------------------------------------------
@pytest.mark.parametrize("name", ["scaling", "probes", "interventions", "tracing", "toy", "lm", "compose"])
def test_profile_computes_the_runs_the_notebook_shows(name, recorded, capsys, monkeypatch):
    if name == "lm":
        monkeypatch.setattr(chapters.by_name("lm").module, "default_device", lambda profile: "cpu")
    calls = recorded(name)
    assert cli.main([name, "--profile", "cpu", "--json"]) == 0
    (profile, kwargs), = calls
    assert profile == "cpu" and kwargs["rerun"] is False and kwargs["executor"] is None
    assert "parts" not in kwargs                      # the chapter's default: what its notebook shows
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "cpu" and out["meaningful"] is True and out["summarised"] is True


def test_profile_passes_the_chapters_own_arguments(recorded, capsys, tmp_path):
    calls = recorded("scaling")
    csv = tmp_path / "c.csv"
    csv.write_text("x\n")
    assert cli.main(["scaling", "--profile", "smoke", "--data", str(csv), "--rerun", "--json"]) == 0
    assert calls[-1] == ("smoke", {"rerun": True, "executor": None, "data_path": str(csv), "progress": True})
    assert json.loads(capsys.readouterr().out)["meaningful"] is False
    calls = recorded("tracing")
    assert cli.main(["tracing", "--profile", "cpu", "--json"]) == 0
    assert calls[-1][1]["extra_models"] == [] and calls[-1][1]["device"] == "cpu"


def test_profile_refuses_a_single_runs_flags_and_force(recorded, capsys):
    recorded("scaling")
    assert cli.main(["scaling", "--profile", "cpu", "--preset", "paper", "--bootstrap", "5"]) == 2
    assert "drop --preset, --bootstrap" in _one_line(capsys)
    assert cli.main(["scaling", "--profile", "cpu", "--force"]) == 2
    assert "--rerun" in _one_line(capsys)
    recorded("interventions")
    assert cli.main(["interventions", "--profile", "cpu", "--plan", "delete:3"]) == 2
    assert "drop --plan" in _one_line(capsys)
    recorded("probes")
    assert cli.main(["probes", "--profile", "cpu", "--executor", "joblib"]) == 2
    assert "computed in this process" in _one_line(capsys)
    assert cli.main(["scaling", "--set", "n_bootstrap=5"]) == 2          # --set changes a profile's runs
    assert "add --profile" in _one_line(capsys)
    assert cli.main(["scaling", "--profile", "cpu", "--bootstrap", "0"]) == 2   # a flag given at 0 is given
    assert "drop --bootstrap" in _one_line(capsys)


def test_the_executor_reaches_the_runs(recorded, capsys):
    shown = chapters.by_name("toy").module.SHOWN_PARTS
    calls = recorded("toy", parts=shown)
    assert cli.main(["toy", "--profile", "smoke", "--executor", "joblib", "--jobs", "2", "--json"]) == 0
    executor = calls[-1][1]["executor"]
    assert executor.kind == "joblib" and executor.jobs == 2
    out = json.loads(capsys.readouterr().out)
    assert list(out["runs"]) == list(shown) and out["profile"] == "smoke"     # several runs: by part


# ---- --part ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, part", [("toy", "calibration"), ("toy", "certified"), ("lm", "converged"),
                                        ("compose", "text_certified"), ("compose", "hierarchy")])
def test_part_computes_one_part(name, part, recorded, capsys, monkeypatch):
    if name == "lm":
        monkeypatch.setattr(chapters.by_name("lm").module, "default_device", lambda profile: "cpu")
    calls = recorded(name)
    assert cli.main([name, "--part", part, "--json"]) == 0
    assert calls[-1][0] == "smoke" and calls[-1][1]["parts"] == (part,)
    assert json.loads(capsys.readouterr().out)["part"] == part


def _usage_error(argv, capsys) -> str:
    """argparse's own error (exit status 2, one line)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    return _one_line(capsys)


def test_an_unknown_part_is_one_line_listing_the_parts(capsys):
    line = _usage_error(["compose", "--part", "grammar"], capsys)
    assert "--part" in line and all(f"'{p}'" in line for p in ("rhm", "hierarchy", "text_certified", "toy_certified"))
    line = _usage_error(["scaling", "--part", "fits"], capsys)        # a chapter without PARTS has one part
    assert "unrecognized arguments: --part" in line


# ---- --set FIELD=VALUE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["scaling", "--profile", "smoke", "--set", "bogus=1"], "--set bogus: ScalingProfile (chapter scaling) has no field "
                                                            "'bogus'"),
    (["scaling", "--profile", "smoke", "--set", "n_bootstrp=3"], "did you mean n_bootstrap?"),
    (["scaling", "--profile", "smoke", "--set", "n_bootstrap=abc"], "--set n_bootstrap: n_bootstrap takes an integer, "
                                                                    "got 'abc'"),
    (["scaling", "--profile", "smoke", "--set", "paper_scan=maybe"], "paper_scan takes true or false, got 'maybe'"),
    (["scaling", "--profile", "smoke", "--set", "scan_offsets=0,x"], "scan_offsets takes comma-separated integers"),
    (["tracing", "--profile", "smoke", "--set", "window=wide"], "window takes an integer or none, got 'wide'"),
    (["toy", "--set", "steps=3"], "2 fields are called 'steps' (sweep.steps, certified.steps)"),
    (["toy", "--set", "sweep=3"], "sweep holds settings of its own; set one of them, e.g. sweep.variant=..."),
    (["toy", "--set", "sweep.cells=[[0.0]]"], "sweep.cells takes a list like [[0.0, 0.1], [0.0, 1.0]"),
    (["toy", "--set", "sweep.depths=4,4"], "depths has duplicates: 4"),                  # the dataclass's validate()
    (["lm", "--set", "nothing"], "--set takes FIELD=VALUE, got 'nothing'"),
    (["compose", "--part", "rhm", "--set", "hierarchy.depths=1,2"], "hierarchy.depths is not in --part rhm's settings"),
    (["compose", "--depths", "2,x"], "--depths: run.depths takes comma-separated integers, got '2,x'"),
])
def test_bad_settings_are_one_line_naming_the_field(argv, message, capsys):
    assert cli.main(argv) == 2
    line = _one_line(capsys)
    assert line.startswith(f"depthlib {argv[0]}: error: ") and message in line, line


def test_settings_are_read_as_their_fields_types():
    from depthlib.compose import chapter as compose
    from depthlib.probes import chapter as probes
    from depthlib.toy import chapter as toy
    from depthlib.tracing import chapter as tracing
    base = toy.PROFILES["smoke"]
    out, changed = settings.apply_settings(base, [("--set", "depths=1,2, 4"), ("--set", "steps=7"), ("--set", "batch=8"),
                                             ("--set", "cells=[(0.0, 1), (1.0, 0.5)]"), ("--set", "variant=exp-9")],
                                      within="sweep")
    assert changed == ("sweep.depths", "sweep.steps", "sweep.batch", "sweep.cells", "sweep.variant")
    assert out.sweep.depths == (1, 2, 4) and out.sweep.steps == 7 and out.sweep.variant == "exp-9"
    assert out.sweep.cells == ((0.0, 1.0), (1.0, 0.5)) and isinstance(out.sweep.cells[0][1], float)
    assert out.converged == base.converged and out.sweep.profile == "smoke"   # the label is the chapter's business
    p, _ = settings.apply_settings(probes.PROFILES["cpu"], [("--set", "models=a,b"), ("--set", "lens_tokens_per_doc=none"),
                                                       ("--set", "sensitivity_noise=0,0.5"), ("--set", "lenses=no")])
    assert p.models == ("a", "b") and p.config.lens_tokens_per_doc is None and p.config.lenses is False
    assert p.sensitivity_noise == (0.0, 0.5) and all(isinstance(v, float) for v in p.sensitivity_noise)
    t, _ = settings.apply_settings(tracing.PROFILES["cpu"], [("--set", "fact_kinds=block,mlp"), ("--set", "window=3")])
    assert t.fact_kinds == ("block", "mlp") and t.window == 3
    c, _ = settings.apply_settings(compose.PROFILES["smoke"], [("--set", "hierarchy.train.steps=10")])
    assert c.hierarchy.train.steps == 10 and c.run == compose.PROFILES["smoke"].run
    with pytest.raises(InputError, match=r"^--set hierarchy.train.steps: steps must be in \[5, "):   # validate() says
        settings.apply_settings(compose.PROFILES["smoke"], [("--set", "hierarchy.depths=1,2"),
                                                            ("--set", "hierarchy.train.steps=3")])
    with pytest.raises(InputError, match=r"^--set name: .* has no field 'name'"):      # names a profile: not a setting
        settings.apply_settings(toy.PROFILES["smoke"], [("--set", "name=x")])


def test_set_makes_custom_settings_and_chooses_the_parts_it_changed(recorded, capsys):
    calls = recorded("compose")
    assert cli.main(["compose", "--set", "text_certified.depths=1,2,4", "--set", "text_certified.n_bootstrap=60",
                     "--json"]) == 0
    settings, kwargs = calls[-1]
    assert kwargs["parts"] == ("text_certified",) and settings.text_certified.depths == (1, 2, 4)
    assert settings.text_certified.n_bootstrap == 60
    assert json.loads(capsys.readouterr().out)["profile"] == "custom"
    assert cli.main(["compose", "--part", "hierarchy", "--set", "seeds=0", "--json"]) == 0
    settings, kwargs = calls[-1]
    assert kwargs["parts"] == ("hierarchy",) and settings.hierarchy.seeds == (0,)   # a name within --part's settings
    calls = recorded("scaling")
    assert cli.main(["scaling", "--profile", "cpu", "--set", "n_bootstrap=10", "--json"]) == 0
    settings, _ = calls[-1]
    from depthlib.scaling.chapter import PROFILES, ScalingProfile
    assert isinstance(settings, ScalingProfile) and settings.n_bootstrap == 10 and settings.paper_scan
    assert cli.main(["scaling", "--profile", "cpu", "--set", "n_bootstrap=1000", "--json"]) == 0
    assert calls[-1][0] == "cpu" and PROFILES["cpu"].n_bootstrap == 1000    # the profile's own value: no custom run


def test_toy_custom_settings_change_its_sweep(recorded, capsys, monkeypatch):
    from depthlib.toy import chapter
    recorded("toy")
    computed = []
    monkeypatch.setattr(chapter, "compute", lambda cfg, device, **kw: computed.append((cfg, device, kw)) or
                        _Run(paths.REPO_ROOT / "data" / "results" / "toy" / next(
                            p.name for p in (paths.REPO_ROOT / "data" / "results" / "toy").iterdir())))
    monkeypatch.setattr(chapter, "summary", lambda run: {"summarised": True})
    assert cli.main(["toy", "--set", "sweep.steps=20", "--json"]) == 0
    cfg, device, kw = computed[-1]
    assert cfg.steps == 20 and cfg.profile == "custom" and device == "cpu"
    assert json.loads(capsys.readouterr().out)["part"] == "sweep"
    assert cli.main(["toy", "--set", "converged.steps_deepest=9"]) == 2
    assert "changes chapter 3's sweep only" in _one_line(capsys)


# ---- the shared flags, once for every chapter --------------------------------------------------------------
def test_every_chapter_command_has_the_shared_flags():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for chapter in chapters.CHAPTERS:
        flags = {f for a in commands[chapter.command]._actions for f in a.option_strings}
        assert {"--profile", "--set", "--rerun", "--json"} <= flags, chapter.name
        assert ("--part" in flags) == hasattr(chapter.module, "PARTS"), chapter.name
        profile = next(a for a in commands[chapter.command]._actions if a.dest == "profile")
        assert tuple(profile.choices) == tuple(chapter.module.PROFILES)
        for old in chapter.former_commands:
            assert commands[old] is commands[chapter.command]


def test_a_command_builds_only_its_own_chapter():
    """``depthlib scaling`` imports chapter 1 alone: the other commands only name themselves."""
    commands = cli.build_parser(only=["scaling"])._subparsers._group_actions[0].choices
    assert any(a.dest == "law" for a in commands["scaling"]._actions)
    assert [a.dest for a in commands["toy"]._actions] == ["help"]
    assert cli._named_chapters(["fit", "--json"]) == ["scaling"] and cli._named_chapters(["--help"]) == []
