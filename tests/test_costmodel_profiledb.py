"""Profile database: HDF5 round trip, statistics, and clear errors for corrupt or foreign files."""

import h5py
import numpy as np
import pytest

from phantora.costmodel.profiledb import FORMAT, ProfileDB, ProfileDBError, summarize
from phantora.costmodel.signature import Signature
from phantora.errors import PhantoraError

MM = Signature("aten.mm.default", ((128, 256), (256, 64)), ("bfloat16", "bfloat16"), ((256, 1), (64, 1)))
ADAM = Signature("aten._fused_adamw_.default", (), (), (), (("amsgrad", False),),
                 ((0, (((4096, 4096), "float32", 30), ((4096,), "float32", 5))),))


def test_round_trip(tmp_path):
    path = tmp_path / "h100.h5"
    db = ProfileDB.create(path, gpu="h100-sxm-80gb", driver="580.1", torch_version="2.13.0", command="phantora profile")
    rng = np.random.default_rng(0)
    samples = {MM: list(rng.uniform(10, 20, 31)), ADAM: [1500.0, 1510.5, 1499.25]}
    for sig, xs in samples.items():
        db.add(sig, xs)
    db.save()
    back = ProfileDB.open(path)
    assert back.meta["gpu"] == "h100-sxm-80gb" and back.meta["driver"] == "580.1"
    assert back.meta["torch_version"] == "2.13.0" and back.meta["command"] == "phantora profile"
    assert back.meta["created"].endswith("Z")
    assert len(back) == 2
    for sig, xs in samples.items():
        rec = back.lookup(sig)
        # independent statistics: numpy's linear-interpolation percentiles
        assert rec.median_us == pytest.approx(np.percentile(xs, 50))
        assert rec.p10_us == pytest.approx(np.percentile(xs, 10))
        assert rec.p90_us == pytest.approx(np.percentile(xs, 90))
        assert rec.count == len(xs)
        assert back.lookup(sig.key()) == rec
    assert back.lookup(Signature("aten.mm.default", ((1, 1), (1, 1)))) is None


def test_add_replaces_and_save_is_atomic(tmp_path):
    path = tmp_path / "p.h5"
    db = ProfileDB.create(path, gpu="x")
    db.add(MM, [1.0])
    db.add(MM, [5.0, 7.0])
    assert db.lookup(MM).median_us == 6.0 and len(db) == 1
    db.save()
    assert path.exists() and not (tmp_path / "p.h5.tmp").exists()
    empty = ProfileDB.create(tmp_path / "empty.h5", gpu="x")
    empty.save()
    assert len(ProfileDB.open(tmp_path / "empty.h5")) == 0


def test_summarize_rejects_bad_samples():
    with pytest.raises(ProfileDBError):
        summarize([])
    with pytest.raises(ProfileDBError):
        summarize([1.0, float("nan")])
    with pytest.raises(ProfileDBError):
        summarize([-1.0])


def test_missing_file(tmp_path):
    with pytest.raises(ProfileDBError, match="no such"):
        ProfileDB.open(tmp_path / "absent.h5")


def test_garbage_file_is_reported(tmp_path):
    p = tmp_path / "garbage.h5"
    p.write_bytes(b"this is not an HDF5 file at all" * 100)
    with pytest.raises(ProfileDBError, match="not an HDF5 file"):
        ProfileDB.open(p)


def test_truncated_file_is_reported(tmp_path):
    path = tmp_path / "t.h5"
    db = ProfileDB.create(path, gpu="x")
    for i in range(200):
        db.add(Signature("aten.add.Tensor", ((i + 1,), (i + 1,))), [float(i + 1)])
    db.save()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PhantoraError):
        ProfileDB.open(path)


def test_foreign_hdf5_file_is_reported(tmp_path):
    p = tmp_path / "foreign.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("data", data=np.arange(10))
    with pytest.raises(ProfileDBError, match="not a Phantora profile"):
        ProfileDB.open(p)


def test_newer_version_is_reported(tmp_path):
    p = tmp_path / "future.h5"
    ProfileDB.create(p, gpu="x").save()
    with h5py.File(p, "a") as f:
        f.attrs["version"] = 99
    with pytest.raises(ProfileDBError, match="version 99"):
        ProfileDB.open(p)


def test_malformed_rows_are_reported(tmp_path):
    p = tmp_path / "bad.h5"
    db = ProfileDB.create(p, gpu="x")
    db.add(MM, [1.0])
    db.save()
    with h5py.File(p, "a") as f:
        rows = f["records"][()]
        rows[0]["key"] = b"not a key"
        del f["records"]
        f.create_dataset("records", data=rows)
    with pytest.raises(ProfileDBError, match="record 0"):
        ProfileDB.open(p)
    with h5py.File(p, "a") as f:
        del f["records"]
        f.create_dataset("records", data=np.zeros(3, dtype=[("key", "S8"), ("median_us", "f8")]))
    with pytest.raises(ProfileDBError, match="columns"):
        ProfileDB.open(p)


def test_format_attribute_is_written(tmp_path):
    p = tmp_path / "a.h5"
    ProfileDB.create(p, gpu="x").save()
    with h5py.File(p, "r") as f:
        assert f.attrs["format"] == FORMAT and int(f.attrs["version"]) == 1


def test_create_requires_gpu(tmp_path):
    with pytest.raises(ProfileDBError):
        ProfileDB.create(tmp_path / "a.h5", gpu="")
