"""The simulated run's CUDA software: `phantora run --torch-cuda/--sdpa` become the cluster's `[software]` section,
reach every rank's environment (which the stubs read back), and validation picks the torch release line of a
ground-truth record from its date (PyTorch's published release dates).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from phantora.cli import main
from phantora.cluster import SoftwareSpec, load_cluster, software_overrides
from phantora.errors import PresetError
from phantora.groundtruth.schema import load_record
from phantora_validation.torchtitan import TORCH_RELEASES, torch_release_of, torchtitan_run_options

ROOT = Path(__file__).resolve().parent.parent


# ---- --torch-cuda / --sdpa -> [software] ----------------------------------------------------------------------------

def test_options_become_the_software_section():
    spec = load_cluster("h100-hgx", nodes=1, overrides=software_overrides("2.6", "flash, efficient,math"))
    assert spec.software == SoftwareSpec(torch_cuda="2.6", sdpa=["flash", "efficient", "math"])


def test_no_options_leave_the_ranks_own_software():
    assert software_overrides(None, None) == []
    assert load_cluster("h100-hgx", nodes=1).software == SoftwareSpec(torch_cuda="", sdpa=[])


@pytest.mark.parametrize("torch_cuda,sdpa,key,bad", [
    pytest.param("two", None, "software.torch_cuda", "two", id="torch-cuda-not-a-release"),
    pytest.param(None, "flash,fast", "software.sdpa", "fast", id="unknown-sdpa-backend"),
])
def test_bad_values_name_the_key(torch_cuda, sdpa, key, bad):
    with pytest.raises(PresetError) as err:
        load_cluster("h100-hgx", nodes=1, overrides=software_overrides(torch_cuda, sdpa))
    assert f"'{key}'" in str(err.value) and f"'{bad}'" in str(err.value)


@pytest.mark.parametrize("release,accepted", [("2.9", True), ("2.1.0", True), ("1.13", False), ("3.0", False), ("latest", False)])
def test_transformer_engine_release(release, accepted):
    """`--transformer-engine VERSION`: a TE 2.x release (the stand-in follows TE 2.x's API), else an error naming
    the key and the value."""
    overrides = software_overrides(None, None, release)
    if accepted:
        assert load_cluster("h100-hgx", nodes=1, overrides=overrides).software.transformer_engine == release
        return
    with pytest.raises(PresetError) as err:
        load_cluster("h100-hgx", nodes=1, overrides=overrides)
    assert "'software.transformer_engine'" in str(err.value) and release in str(err.value)


# ---- the ranks' environment -------------------------------------------------------------------------------------------

def _rank_env(spec, monkeypatch) -> dict[str, str]:
    from phantora.live.launcher import rank_environment

    # the launcher's own environment must not leak its PHANTORA_* settings into the ranks
    monkeypatch.setenv("PHANTORA_TORCH_CUDA", "2.3")
    monkeypatch.setenv("PHANTORA_SDPA", "math")
    opts = types.SimpleNamespace(spec=spec, env={})
    server = types.SimpleNamespace(address="127.0.0.1:1", authkey=b"\x01\x02\x03\x04",
                                   stack_file=lambda rank: f"stacks-{rank}.txt")
    return rank_environment(opts, server, rank=0, port=29500, epoch=0.0)


def test_rank_environment_carries_the_software(monkeypatch):
    spec = load_cluster("h100-hgx", nodes=1, overrides=software_overrides("2.6", "flash,efficient,math", "2.9"))
    env = _rank_env(spec, monkeypatch)
    assert env["PHANTORA_TRANSFORMER_ENGINE"] == "2.9"
    assert env["PHANTORA_TORCH_CUDA"] == "2.6"
    assert env["PHANTORA_SDPA"] == "flash,efficient,math"
    # and the rank's stubs read back the same release and order
    sys.path.insert(0, str(ROOT / "stubs"))
    try:
        from phantora_stubs.config import StubConfig
    finally:
        sys.path.remove(str(ROOT / "stubs"))
    for k in [k for k in os.environ if k.startswith("PHANTORA_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = StubConfig.from_env()
    assert cfg.torch_cuda == (2, 6) and cfg.sdpa == ("flash", "efficient", "math")
    assert cfg.transformer_engine == "2.9"


def test_rank_environment_without_software_is_empty(monkeypatch):
    env = _rank_env(load_cluster("h100-hgx", nodes=1), monkeypatch)
    assert env["PHANTORA_TORCH_CUDA"] == "" and env["PHANTORA_SDPA"] == "" and env["PHANTORA_TRANSFORMER_ENGINE"] == ""


# ---- the command line -------------------------------------------------------------------------------------------------

def test_cli_bad_sdpa_is_a_one_line_error():
    res = CliRunner().invoke(main, ["run", "--sdpa", "flash,fast", "--", "python", "-c", "pass"])
    assert res.exit_code == 2
    assert isinstance(res.exception, SystemExit)                 # a usage error, not an escaped exception
    assert "'--sdpa'" in res.output and "'fast'" in res.output and "Traceback" not in res.output


def test_cli_bad_sdpa_as_a_process():
    exe = Path(sys.executable).with_name("phantora")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from phantora.cli import main; "
                                                                  "sys.argv[0] = 'phantora'; main()"]
    proc = subprocess.run([*cmd, "run", "--sdpa", "flash,fast", "--", "python", "-c", "pass"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [x for x in proc.stderr.splitlines() if x.startswith("Error:")]
    assert len(errors) == 1 and "'--sdpa'" in errors[0], proc.stderr


@pytest.mark.parametrize("option,value,said", [
    ("--torch-cuda", "two", "'two' is not a torch release"),
    ("--sdpa", "flash,fast", "unknown SDPA backend 'fast'"),
    ("--sdpa", ",", "names no SDPA backend"),
    ("--transformer-engine", "1.13", "TE 2.0 and later"),
])
def test_cli_bad_software_values_name_the_option_given(option, value, said):
    res = CliRunner().invoke(main, ["run", option, value, "--", "python", "-c", "pass"])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{option}'" in errors[0] and said in errors[0], res.output
    assert "--set" not in res.output and "software." not in res.output and ".toml" not in res.output


# ---- validation: a record's torch release line ------------------------------------------------------------------------

# PyTorch's release blog posts (pytorch.org/blog/pytorch-2-N and the GitHub releases v2.N.0)
PUBLISHED = {"2.3": "2024-04-24", "2.4": "2024-07-24", "2.5": "2024-10-17", "2.6": "2025-01-29",
             "2.7": "2025-04-23", "2.8": "2025-08-06", "2.9": "2025-10-15"}


def test_release_dates_are_pytorchs_published_ones():
    assert dict(TORCH_RELEASES) == PUBLISHED
    assert [r for r, _ in TORCH_RELEASES] == sorted(PUBLISHED, key=lambda r: tuple(map(int, r.split("."))))


def _record_on(date: str):
    rec = load_record(sorted((ROOT / "groundtruth" / "torchtitan").glob("*.toml"))[0])
    return dataclasses.replace(rec, source=dataclasses.replace(rec.source, date=date))


def _day_before(date: str) -> str:
    import datetime

    return (datetime.date.fromisoformat(date) - datetime.timedelta(days=1)).isoformat()


@pytest.mark.parametrize("i", range(len(PUBLISHED)), ids=list(PUBLISHED))
def test_record_date_picks_the_release_line(i):
    """A run of the day before release N's publication ran N's development line; one of the publication day ran
    release N itself, whose kernels are those of the next line's development (or unknown after the last)."""
    releases = list(PUBLISHED)
    release, published = releases[i], PUBLISHED[releases[i]]
    nxt = releases[i + 1] if i + 1 < len(releases) else None
    assert torch_release_of(_record_on(_day_before(published))) == release
    assert torch_release_of(_record_on(published)) == nxt


@pytest.mark.parametrize("release", list(PUBLISHED))
def test_run_options_of_a_release(release):
    opts = torchtitan_run_options(_record_on(_day_before(PUBLISHED[release])))
    assert opts[opts.index("--torch-cuda") + 1] == release
    if tuple(map(int, release.split("."))) < (2, 9):
        # TorchTitan called SDPA without an order and torch put flash attention first
        assert opts[opts.index("--sdpa") + 1].split(",")[0] == "flash"
    else:
        assert "--sdpa" not in opts                 # torch's own order (cuDNN first on Hopper)


def test_run_options_after_the_last_release_are_the_ranks_own():
    assert torchtitan_run_options(_record_on(PUBLISHED["2.9"])) == []
    assert torch_release_of(_record_on("2030-01-01")) is None


def test_cli_profile_of_another_gpu_is_refused_before_any_rank_starts():
    """`--profile` must be a profile of the cluster's GPU: the H200 database (its stored GPU attribute) cannot cost
    an H100 cluster."""
    h200 = Path(__file__).resolve().parent.parent / "presets" / "profiles" / "h200-sxm-141gb.h5"
    res = CliRunner().invoke(main, ["run", "--gpu", "h100-sxm-80gb", "--profile", str(h200), "--no-trace", "--",
                                    "python", "-c", "raise SystemExit('a rank started')"])
    assert res.exit_code != 0
    assert "measured on h200-sxm-141gb" in res.output and "a rank started" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
