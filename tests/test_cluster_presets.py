"""Cluster presets load into typed dataclasses; bad files and overrides give errors that name the file and key."""

import pytest

from phantora.cluster import apply_overrides, list_clusters, load_cluster
from phantora.errors import PresetError

REQUIRED = {"h100-hgx", "a100-hgx", "h200-4gpu-nvlink", "rtx3090-pcie"}


def test_required_presets_exist():
    assert REQUIRED <= set(list_clusters())


@pytest.mark.parametrize("name", list_clusters())
def test_presets_load_with_their_gpu(name):
    spec = load_cluster(name)
    gpu = spec.gpu_spec()
    assert spec.world_size == spec.nodes * spec.gpus_per_node
    if spec.intra.kind != "pcie":
        # the preset's NVLink must not exceed what the GPU has
        assert spec.intra.nvlink_links_per_gpu == gpu.nvlink_links


def test_nodes_parameter():
    assert load_cluster("h100-hgx", nodes=16).world_size == 128


def test_unknown_key_names_file_and_key(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('name = "x"\ngpu = "h100-sxm-80gb"\ngpus_per_node = 8\n[net]\nnic_gbps = 400\n')
    with pytest.raises(PresetError) as e:
        load_cluster(str(f))
    assert "bad.toml" in str(e.value) and "net.nic_gbps" in str(e.value)


def test_wrong_type_names_key(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('name = "x"\ngpu = "h100-sxm-80gb"\ngpus_per_node = "eight"\n')
    with pytest.raises(PresetError, match="gpus_per_node"):
        load_cluster(str(f))


def test_missing_required_key(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('name = "x"\ngpus_per_node = 8\n')
    with pytest.raises(PresetError, match="'gpu'"):
        load_cluster(str(f))


def test_invalid_toml(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('name = "x\n')
    with pytest.raises(PresetError, match="not valid TOML"):
        load_cluster(str(f))


def test_unknown_gpu_is_reported():
    with pytest.raises(PresetError, match="unknown GPU preset"):
        load_cluster("h100-hgx", gpu="h999")


def test_set_reaches_nested_fields():
    spec = apply_overrides(load_cluster("h100-hgx", nodes=2), ["net.inter_node_gbps=100", "intra.nvlink_links_per_gpu=9"])
    assert spec.net.inter_node_gbps == 100.0 and spec.intra.nvlink_links_per_gpu == 9


def test_set_rejects_unknown_field_and_bad_value():
    spec = load_cluster("h100-hgx")
    with pytest.raises(PresetError, match="net.nic_speed"):
        apply_overrides(spec, ["net.nic_speed=100"])
    with pytest.raises(PresetError, match="net.inter_node_gbps"):
        apply_overrides(spec, ["net.inter_node_gbps=fast"])
    with pytest.raises(PresetError, match="key=value"):
        apply_overrides(spec, ["nodes"])


def test_multi_node_without_network_is_rejected():
    with pytest.raises(PresetError, match="nics_per_node"):
        load_cluster("h200-4gpu-nvlink", nodes=2)
