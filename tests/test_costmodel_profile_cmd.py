"""`phantora profile`: which signatures it measures (exactly the traces' kernel signatures), merging into an existing
database, --force, and the error without a CUDA GPU. The measuring function is a stand-in; live measurement itself
is tested in test_costmodel_measure.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from phantora.probes import profile_cmd
from phantora.costmodel.families import NO_KERNEL, classify, work
from phantora.costmodel.measure import cuda_available
from phantora.probes.profile_cmd import describe, guess_gpu, profile_command, profile_traces
from phantora.costmodel.profiledb import ProfileDB
from phantora.costmodel.signature import Signature, signature_of
from phantora.engine.ops import OpKind
from phantora.errors import PhantoraError
from phantora.gpus import list_gpus, load_gpu
from phantora.trace import schema as S
from phantora.trace.reader import TraceReader
from phantora.trace.writer import TraceWriter

aten = torch.ops.aten
BF = torch.bfloat16
GPU = "h100-sxm-80gb"
DEVICE = ("NVIDIA H100 80GB HBM3", "550.54.15", torch.__version__)


def T(*shape, dtype=BF):
    return torch.empty(shape, dtype=dtype, device="meta")


def sigs_a() -> dict[str, Signature]:
    return {"mm": signature_of(aten.mm.default, (T(256, 512), T(512, 128))),
            "add": signature_of(aten.add.Tensor, (T(4096), T(4096))),
            "view": signature_of(aten.view.default, (T(64, 64), [4096])),
            "copy": signature_of(aten._to_copy.default, (T(1024),), {"dtype": torch.float32}),
            "unused": signature_of(aten.mm.default, (T(8, 8), T(8, 8)))}


def write_trace(path, sigs: dict[str, Signature], use: list[tuple[str, int, int]]):
    """A two-rank trace whose signature table holds `sigs` (in order); `use` lists (signature name, op kind,
    rank) of the op rows that refer to them, plus ops without a signature."""
    with TraceWriter(path, {"ranks": [0, 1], "world_size": 2}) as w:
        ids = {name: w.add_signature(s.key()) for name, s in sigs.items()}
        for rank in (0, 1):
            mine = [(name, kind) for name, kind, r in use if r == rank]
            rows = S.empty_ops(len(mine) + 2)
            rows["kind"][:len(mine)] = [int(k) for _, k in mine]
            rows["sig"][:len(mine)] = [ids[name] for name, _ in mine]
            rows["kind"][len(mine):] = [int(OpKind.KERNEL), int(OpKind.COLLECTIVE)]   # no signature
            w.append_ops(rank, rows)


def kernel_keys(*paths) -> set[str]:
    """Signatures the kernel and copy rows of the traces refer to, read straight from the tables."""
    out = set()
    for p in paths:
        with TraceReader(p) as r:
            for rank in r.ranks:
                ops = r.ops(rank)
                sel = np.isin(ops["kind"], [int(OpKind.KERNEL), int(OpKind.MEMCPY)]) & (ops["sig"] >= 0)
                out |= {r.signatures[i] for i in ops["sig"][sel].tolist()}
    return out


class FakeMeasure:
    """Stands in for the GPU: samples from a counter, so a re-measurement records different values."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, sig, iters, warmup):
        self.calls.append((sig.key(), iters, warmup))
        base = float(len(self.calls))
        return [base, base + 1.0, base + 2.0]


@pytest.fixture
def traces(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    s = sigs_a()
    write_trace(a, s, [("mm", OpKind.KERNEL, 0), ("mm", OpKind.KERNEL, 1), ("add", OpKind.KERNEL, 1),
                       ("view", OpKind.KERNEL, 0), ("copy", OpKind.MEMCPY, 0)])
    extra = {"bmm": signature_of(aten.bmm.default, (T(4, 64, 32), T(4, 32, 16))), "mm": s["mm"]}
    write_trace(b, extra, [("bmm", OpKind.KERNEL, 0), ("mm", OpKind.KERNEL, 1)])
    return a, b


def measurable(keys: set[str]) -> set[str]:
    return {k for k in keys if classify(Signature.from_key(k).op) not in NO_KERNEL
            and not work(Signature.from_key(k)).is_view}


def test_measures_exactly_the_kernel_signatures_of_the_traces(traces, tmp_path):
    a, b = traces
    fake = FakeMeasure()
    lines = []
    run = profile_traces([a, b], tmp_path / "p.h5", gpu=GPU, measure=fake, device=DEVICE, warmup=2, iters=7,
                         echo=lines.append)
    expected = measurable(kernel_keys(a, b))
    assert sigs_a()["unused"].key() not in kernel_keys(a, b)          # in the table, used by no op
    assert sigs_a()["view"].key() in kernel_keys(a, b) and sigs_a()["view"].key() not in expected
    measured = [k for k, _, _ in fake.calls]
    assert len(measured) == len(set(measured)) and set(measured) == expected == set(run.measured)
    assert all(it == 7 and wu == 2 for _, it, wu in fake.calls)
    db = ProfileDB.open(tmp_path / "p.h5")
    assert {k for k, _ in db.items()} == expected and db.gpu == GPU
    assert db.meta["driver"] == DEVICE[1] and db.meta["torch_version"] == DEVICE[2]
    # one progress line per distinct signature, n/total, then the summary
    progress = [line for line in lines if line.startswith("[")]
    total = len(kernel_keys(a, b))
    assert [line.split("]")[0] for line in progress] == [f"[{i}/{total}" for i in range(1, total + 1)]
    assert "failed 0" in lines[-1] and f"holds {len(expected)} signature(s)" in lines[-1]
    for key, _, _ in fake.calls:                                        # the median of the fake's samples
        rec = db.lookup(key)
        assert rec.median_us == rec.p10_us + (rec.p90_us - rec.p10_us) / 2 and rec.count == 3


def test_merging_skips_known_signatures_and_force_remeasures(traces, tmp_path):
    a, b = traces
    out = tmp_path / "p.h5"
    first = FakeMeasure()
    profile_traces([a], out, gpu=GPU, measure=first, device=DEVICE, echo=lambda s: None)
    before = dict(ProfileDB.open(out).items())
    again = FakeMeasure()
    run = profile_traces([a, b], out, measure=again, device=DEVICE, echo=lambda s: None)   # gpu from the file
    new = measurable(kernel_keys(b)) - measurable(kernel_keys(a))
    assert new and {k for k, _, _ in again.calls} == new
    assert run.already == len(measurable(kernel_keys(a)))          # everything of a was measured before
    after = dict(ProfileDB.open(out).items())
    assert {k: after[k] for k in before} == before and set(after) == set(before) | new
    forced = FakeMeasure()
    forced.calls = [("", 0, 0)] * 100                                   # other sample values than before
    profile_traces([a], out, gpu=GPU, force=True, measure=forced, device=DEVICE, echo=lambda s: None)
    final = dict(ProfileDB.open(out).items())
    assert {k for k, _, _ in forced.calls[100:]} == set(before)
    assert all(final[k] != before[k] for k in before) and all(final[k] == after[k] for k in new)


def test_database_of_another_gpu_is_refused(traces, tmp_path):
    a, _ = traces
    out = tmp_path / "p.h5"
    profile_traces([a], out, gpu=GPU, measure=FakeMeasure(), device=DEVICE, echo=lambda s: None)
    a100 = (load_gpu("a100-sxm-80gb").display_name, *DEVICE[1:])
    with pytest.raises(PhantoraError, match="profile of h100-sxm-80gb"):
        profile_traces([a], out, gpu="a100-sxm-80gb", measure=FakeMeasure(), device=a100, echo=lambda s: None)


def test_a_gpu_preset_other_than_this_machine_s_gpu_is_refused(traces, tmp_path):
    """Times taken on an H100 must not be recorded as another GPU's, whatever --gpu says."""
    a, _ = traces
    fake = FakeMeasure()
    with pytest.raises(PhantoraError, match="preset h100-sxm-80gb"):
        profile_traces([a], tmp_path / "p.h5", gpu="h200-sxm-141gb", measure=fake, device=DEVICE,
                       echo=lambda s: None)
    assert not fake.calls and not (tmp_path / "p.h5").exists()


def test_failures_are_reported_not_fatal(traces, tmp_path):
    a, _ = traces

    def flaky(sig, iters, warmup):
        if sig.op == "aten.add.Tensor":
            raise PhantoraError("cannot measure aten.add.Tensor: out of memory")
        return [1.0]

    lines = []
    run = profile_traces([a], tmp_path / "p.h5", gpu=GPU, measure=flaky, device=DEVICE, echo=lines.append)
    assert [k for k, _ in run.failed] == [sigs_a()["add"].key()]
    assert any("failed: cannot measure aten.add.Tensor" in line for line in lines)
    assert sigs_a()["add"].key() not in ProfileDB.open(tmp_path / "p.h5")


def test_gpu_preset_from_the_device_name():
    # every preset whose display name no other preset shares is found from it
    names = {g: load_gpu(g).display_name for g in list_gpus()}
    for g, shown in names.items():
        if list(names.values()).count(shown) == 1:
            assert guess_gpu(shown) == g
    assert guess_gpu("Some Other Accelerator 9000") is None


def test_cli_progress_and_summary(traces, tmp_path, monkeypatch):
    a, b = traces
    fake = FakeMeasure()
    monkeypatch.setattr(profile_cmd, "_live_measure", fake)
    monkeypatch.setattr(profile_cmd, "_local_facts", lambda: DEVICE)
    res = CliRunner().invoke(profile_command, [str(a), str(b), "--out", str(tmp_path / "p.h5"), "--iters", "5"])
    assert res.exit_code == 0, res.output
    assert len(fake.calls) == len(measurable(kernel_keys(a, b)))
    assert f"as {GPU}" in res.output.splitlines()[0]                    # guessed from the device name
    mm = sigs_a()["mm"]
    assert describe(mm) in res.output and "measured" in res.output.splitlines()[-1]
    db = ProfileDB.open(tmp_path / "p.h5")
    assert "phantora profile" in db.meta["command"] and "--iters 5" in db.meta["command"]


def test_help_answers_to_h_as_in_the_other_commands():
    from phantora.cli import main

    for flag in ("-h", "--help"):
        res = CliRunner().invoke(main, ["profile", flag])
        assert res.exit_code == 0, res.output
        assert res.output.startswith("Usage: ") and "--out" in res.output


def test_model_form_is_not_there_yet(traces, tmp_path):
    a, _ = traces
    res = CliRunner().invoke(profile_command, [str(a), "--out", str(tmp_path / "p.h5"), "--model", "llama3-8b"])
    assert res.exit_code != 0 and "not supported yet" in res.output and "Traceback" not in res.output


@pytest.mark.skipif(cuda_available(), reason="checks the behaviour without a CUDA GPU")
def test_without_a_gpu_one_clear_line(traces, tmp_path):
    a, _ = traces
    res = CliRunner().invoke(profile_command, [str(a), "--out", str(tmp_path / "p.h5")])
    assert res.exit_code != 0
    assert res.output.count("\n") == 1 and "CUDA GPU" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p.h5").exists()


def test_op_filter_and_remeasuring_a_databases_own_records(traces, tmp_path):
    a, b = traces
    out = tmp_path / "p.h5"
    first = FakeMeasure()
    run = profile_traces([a, b], out, gpu=GPU, measure=first, device=DEVICE, echo=lambda s: None,
                         ops=["aten.mm"])                              # without the overload: every overload
    mm_keys = {k for k in measurable(kernel_keys(a, b)) if Signature.from_key(k).op == "aten.mm.default"}
    assert mm_keys and {k for k, _, _ in first.calls} == mm_keys == set(run.measured)
    profile_traces([a, b], out, gpu=GPU, measure=FakeMeasure(), device=DEVICE, echo=lambda s: None)
    before = dict(ProfileDB.open(out).items())
    # no trace: the database's own records of the op, measured again with --force; the others untouched
    again = FakeMeasure()
    again.calls = [("", 0, 0)] * 100
    res_lines = []
    profile_traces([], out, force=True, measure=again, device=DEVICE, echo=res_lines.append,
                   ops=["aten.bmm.default"])
    bmm = {k for k in before if Signature.from_key(k).op == "aten.bmm.default"}
    assert bmm and {k for k, _, _ in again.calls[100:]} == bmm
    after = dict(ProfileDB.open(out).items())
    assert all(after[k] != before[k] for k in bmm) and all(after[k] == before[k] for k in set(before) - bmm)
    assert "itself" in res_lines[0]
    with pytest.raises(PhantoraError, match="no signature of aten.softmax"):
        profile_traces([], out, force=True, measure=FakeMeasure(), device=DEVICE, ops=["aten.softmax"])
    with pytest.raises(PhantoraError, match="--op"):
        profile_traces([], out, measure=FakeMeasure(), device=DEVICE)
    with pytest.raises(PhantoraError, match="does not exist"):
        profile_traces([], tmp_path / "none.h5", gpu=GPU, measure=FakeMeasure(), device=DEVICE, ops=["aten.mm"])


def test_a_preset_of_this_gpu_s_name_from_a_file_is_accepted(traces, tmp_path):
    """--gpu may be a TOML file (a power-limited copy of a preset): what must match is the GPU's name."""
    from phantora.gpus import gpu_dir
    a, _ = traces
    mine = tmp_path / "my-h100.toml"
    mine.write_text((gpu_dir() / f"{GPU}.toml").read_text().replace(f'name = "{GPU}"', 'name = "my-h100"'))
    fake = FakeMeasure()
    profile_traces([a], tmp_path / "p.h5", gpu=str(mine), measure=fake, device=DEVICE, echo=lambda s: None)
    assert fake.calls
