"""A record's `hardware.host_cpu_cores`: the measured host's cores, from its raw output, reach the simulation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phantora.errors import PresetError
from phantora.groundtruth.checks import check_record
from phantora.groundtruth.store import load_suite
from phantora.paths import groundtruth_dir
from phantora_validation.cases import load_cases
from phantora_validation.runner import LiveRunner


def _nproc(folder: Path) -> set[int]:
    """Every `nproc` line of the folder's system*.txt files (each measuring part wrote one)."""
    return {int(line) for path in folder.glob("system*.txt") for line in path.read_text().splitlines()
            if line.strip().isdigit()}


def test_deepspeed_records_carry_the_cores_their_hosts_reported():
    for _, rec in load_suite("deepspeed"):
        folder = groundtruth_dir().parent / Path(rec.source.section).parent     # the raw output's folder
        assert _nproc(folder) == {rec.hardware.host_cpu_cores}, rec.id


def test_cases_run_with_the_record_hosts_cores():
    records = dict((rec.id, rec) for _, rec in load_suite("deepspeed"))
    for case in load_cases("deepspeed"):
        run = LiveRunner(["phantora"]).command(case, Path("t.h5"), Path("s.json"))
        options = run[:run.index("--")]
        assert f"host.cpu_cores={records[case.id].hardware.host_cpu_cores}" in options
        assert options[options.index(f"host.cpu_cores={records[case.id].hardware.host_cpu_cores}") - 1] == "--set"
    # a record without the key runs on its cluster preset's cores
    for case in load_cases("megatron"):
        assert case.record.hardware.host_cpu_cores is None
        assert not any(o.startswith("host.cpu_cores=") for o in case.run_options)


@pytest.mark.parametrize("cores", [0, -4])
def test_schema_refuses_a_host_without_cores(cores):
    _, rec = load_suite("deepspeed")[0]
    bad = dataclasses.replace(rec.hardware, host_cpu_cores=cores)
    with pytest.raises(PresetError, match=r"hardware\.host_cpu_cores"):
        bad.validate()


def test_an_offloading_record_without_its_hosts_cores_is_warned():
    records = [rec for _, rec in load_suite("deepspeed")]
    offload = [rec for rec in records if rec.workload.options.get("offload_optimizer") == "cpu"]
    assert offload
    for rec in offload:
        assert not any("host_cpu_cores" in w for w in check_record(rec).warnings)
        bare = dataclasses.replace(rec, hardware=dataclasses.replace(rec.hardware, host_cpu_cores=None))
        assert any("hardware.host_cpu_cores" in w for w in check_record(bare).warnings)
    plain = next(rec for rec in records if "offload_optimizer" not in rec.workload.options)
    bare = dataclasses.replace(plain, hardware=dataclasses.replace(plain.hardware, host_cpu_cores=None))
    assert not any("host_cpu_cores" in w for w in check_record(bare).warnings)


def test_hosts_of_other_cores_are_other_configurations():
    """One offload configuration on a 32-core and a 16-core host (0.634 against 0.822 s a step on one host,
    groundtruth/deepspeed/h200x2-offload-g1/) is not a contradiction of one record by the other."""
    from phantora.groundtruth.store import config_key

    _, rec = next((p, r) for p, r in load_suite("deepspeed") if r.workload.options.get("offload_optimizer") == "cpu")
    other = dataclasses.replace(rec, hardware=dataclasses.replace(rec.hardware, host_cpu_cores=16))
    assert config_key(other) != config_key(rec)
    assert config_key(dataclasses.replace(other, notes="measured again")) == config_key(other)


def test_records_name_the_host_their_nvidia_smi_listed():
    """A row measured on a one-GPU host says so (not the two-GPU host type of most rows)."""
    seen = set()
    for _, rec in load_suite("deepspeed"):
        folder = groundtruth_dir().parent / Path(rec.source.section).parent
        listed = max(sum(line.startswith("NVIDIA ") for line in path.read_text().splitlines())
                     for path in folder.glob("system*.txt"))
        seen.add(listed)
        assert ("a one-H200 host" in rec.notes) == (listed == 1), rec.id
        assert ("2 NVLinked H200" in rec.notes) == (listed == 2), rec.id
    assert seen == {1, 2}


def test_offload_options_reach_the_workloads_command():
    cases = [case for case in load_cases("deepspeed") if "offload_param" in case.record.workload.options]
    assert cases
    for case in cases:
        run = LiveRunner(["phantora"]).command(case, Path("t.h5"), Path("s.json"))
        program = run[run.index("--") + 1:]
        for key, flag in (("offload_param", "--offload-param"), ("offload_optimizer", "--offload-optimizer")):
            assert program[program.index(flag) + 1] == case.record.workload.options[key], case.id
