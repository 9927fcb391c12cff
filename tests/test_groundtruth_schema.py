"""Record schema details: the canonical TOML writer reads back exactly, suites are discovered generically, a record
must sit where its suite and id say, and whole-record rules (parallel degrees × = GPUs, batch divisibility)."""

import shutil
import tomllib

import pytest

from phantora.errors import PresetError
from phantora.groundtruth import store
from phantora.groundtruth.schema import load_record, record_from_table
from phantora.groundtruth.tomlwrite import dumps
from phantora.paths import groundtruth_dir

SAMPLE = groundtruth_dir() / "torchtitan" / "h100-128-llama3-8b-b2-fsdp.toml"


def test_writer_round_trips_awkward_values():
    table = {"a": 'quote " and back\\slash', "b": "two\nlines \"quoted\"", "c": "ünïcode", "d": 0.1 + 0.2,
             "e": 1e-300, "f": -3, "g": True, "h": [1, 2.5, "x"],
             "t": {"k.with.dots": "v", "nested": {"x": 1}}, "empty": {}}
    assert tomllib.loads(dumps(table, header="two\nheader lines")) == table


def test_canonical_text_of_a_record_reads_back_to_it():
    rec = load_record(SAMPLE)
    assert record_from_table(tomllib.loads(dumps(rec.to_table()))) == rec


def _copy(tmp_path, suite, name=SAMPLE.name):
    d = tmp_path / suite
    d.mkdir(parents=True, exist_ok=True)
    return shutil.copy(SAMPLE, d / name)


def test_any_folder_with_records_is_a_suite(tmp_path):
    assert store.list_suites(tmp_path) == []
    (tmp_path / "empty").mkdir()
    _copy(tmp_path, "torchtitan")
    assert store.list_suites(tmp_path) == ["torchtitan"]


def test_record_must_sit_in_its_suite_under_its_id(tmp_path):
    p = _copy(tmp_path, "local")
    with pytest.raises(PresetError, match="suite 'torchtitan'") as exc:
        store.load_suite("local", tmp_path)
    assert str(p) in str(exc.value)
    _copy(tmp_path, "torchtitan", "renamed.toml")
    with pytest.raises(PresetError, match="differs from its file name"):
        store.load_suite("torchtitan", tmp_path)


def _table():
    return tomllib.loads(SAMPLE.read_text())


def test_parallel_degrees_must_multiply_to_the_gpu_count():
    t = _table()
    t["workload"]["parallelism"]["tp"] = 2
    with pytest.raises(PresetError, match="workload.parallelism"):
        record_from_table(t)


def test_a_measurement_cannot_be_dated_in_the_future():
    t = _table()
    t["source"]["date"] = "2099-01-01"
    with pytest.raises(PresetError, match="source.date.*future|future.*source.date"):
        record_from_table(t)


def test_global_batch_must_be_a_multiple_of_the_data_parallel_batch():
    t = _table()
    t["workload"]["global_batch"] = 300          # 128 GPUs × local batch 2 = 256 per step
    with pytest.raises(PresetError, match="workload.global_batch"):
        record_from_table(t)
    t["workload"]["global_batch"] = 512          # two accumulation steps
    assert record_from_table(t).workload.grad_accumulation == 2


def test_multi_host_record_needs_its_network():
    t = _table()
    t["hardware"]["inter_host_gbps_per_gpu"] = 0.0
    with pytest.raises(PresetError, match="hardware.inter_host_gbps_per_gpu"):
        record_from_table(t)


def test_allocated_memory_cannot_exceed_the_peak_the_allocator_held():
    # PyTorch's caching allocator hands tensors part of the memory it reserves: max_memory_allocated <=
    # max_memory_reserved, always
    t = _table()
    t["metrics"]["memory_gib"] = 67.0
    t["metrics"]["memory_allocated_gib"] = 61.5
    assert record_from_table(t).metrics.measured()["memory_allocated_gib"] == 61.5
    t["metrics"]["memory_allocated_gib"] = 70.0
    with pytest.raises(PresetError, match="metrics.memory_allocated_gib"):
        record_from_table(t)
