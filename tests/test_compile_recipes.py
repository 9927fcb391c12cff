"""Generated kernels' recipes (stubs/phantora_stubs/kernel_recipe.py, phantora/costmodel/generated.py): what a
compiled region's trace keeps of each kernel Inductor generated is enough to rebuild the same computation on
another machine, which `phantora profile` compiles and times on a GPU host."""

from __future__ import annotations

import json

import pytest
import torch

from phantora.costmodel.generated import parse, rebuild
from phantora.costmodel.signature import Signature
from phantora.errors import PhantoraError
from phantora.probes.profile_cmd import profile_traces
from phantora.trace.reader import TraceReader
from test_costmodel_profile_cmd import DEVICE, GPU, FakeMeasure


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory):
    """A trace of tests/scripts/compiled_steps.py (a pointwise chain; a block trained compiled, with and without
    activation checkpointing; a graph break) under `phantora run`."""
    import subprocess
    import sys
    from test_stubs_live import ROOT, SCRIPTS

    trace = tmp_path_factory.mktemp("recipes") / "compiled.h5"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--gpus-per-node", "1", "--quiet", "--trace", str(trace),
                           "--", sys.executable, str(SCRIPTS / "compiled_steps.py")],
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with TraceReader(trace) as r:
        sigs = [Signature.from_key(k) for k in r.signatures]
    return trace, [s for s in sigs if s.op.startswith("inductor.")]


def test_the_chain_s_recipe_recomputes_the_chain(compiled_trace):
    _, sigs = compiled_trace
    chain = [s for s in sigs if s.scalar("name") == "fused_add_mul_relu"]
    assert len(chain) == 1
    recipe = parse(chain[0].scalar("graph"))
    assert [op for op, _, _ in recipe["ops"]] == ["aten.mul.Tensor", "aten.add.Tensor", "aten.relu.default"]
    kernel, inputs = rebuild(chain[0].scalar("graph"), device="cpu")
    assert len(inputs) == 1 and inputs[0].shape == (1 << 24,) and inputs[0].dtype == torch.bfloat16
    (out,) = kernel(*inputs)
    assert torch.equal(out, torch.relu(inputs[0] * 2 + 1))
    # what the kernel reads and writes once each, as its signature's bytes say
    assert chain[0].scalar("bytes") == sum(t.numel() * t.element_size() for t in (*inputs, out))


def test_every_static_kernel_of_a_training_step_rebuilds_and_runs(compiled_trace):
    """Forward, backward, RMSNorm, SiLU and their gradients, activation checkpointing: each recipe runs on the CPU
    and stores tensors, and moves the bytes Inductor counted for the kernel within the factor 1.5 a recipe is kept
    at."""
    _, sigs = compiled_trace
    with_recipe = [s for s in sigs if s.scalar("graph")]
    assert len(with_recipe) >= 0.8 * len(sigs) and len(with_recipe) >= 8
    for s in with_recipe:
        kernel, inputs = rebuild(s.scalar("graph"), device="cpu")
        outs = kernel(*inputs)
        assert outs and all(isinstance(o, torch.Tensor) for o in outs), s.scalar("name")
        moved = sum(t.numel() * t.element_size() for t in (*inputs, *outs))
        assert s.scalar("bytes") / 1.5 <= moved <= 1.5 * s.scalar("bytes"), (s.scalar("name"), moved)


def test_profile_measures_generated_kernels_with_a_recipe(compiled_trace, tmp_path):
    trace, sigs = compiled_trace
    fake = FakeMeasure()
    run = profile_traces([trace], tmp_path / "db.h5", gpu=GPU, measure=fake, device=DEVICE, echo=lambda _: None)
    measured = {json.loads(k)[0] for k, _, _ in fake.calls}
    assert "inductor.pointwise.default" in measured
    assert sum(1 for k, _, _ in fake.calls if k.startswith('["inductor')) == sum(1 for s in sigs if s.scalar("graph"))
    assert not run.failed


@pytest.mark.parametrize("text, says", [
    ("not json", "not JSON"),
    ('{"in": [], "ops": []}', "'in', 'ops' and 'out'"),
    ('{"in": [], "ops": [["os.system", ["ls"], {}]], "out": [0]}', "not an aten or prims op"),
    ('{"in": [], "ops": [["aten.relu.default", [{"in": 0}], {}]], "out": [3]}', "does not have"),
    ('{"in": [], "ops": [["aten.relu.default", [{"in": 0}], {}]], "out": [0]}', "input it does not list"),
    ('{"in": [[[4], [1], "float32"]], "ops": [["aten.relu.default", [{"n": 0}], {}]], "out": [0]}',
     "no earlier op made"),
    ('{"in": [[[4], [1, 1], "float32"]], "ops": [["aten.relu.default", [{"in": 0}], {}]], "out": [0]}',
     "not \\[shape, stride, dtype\\]"),
])
def test_a_bad_recipe_is_refused_naming_what_is_wrong(text, says):
    with pytest.raises(PhantoraError, match=says):
        parse(text)


@pytest.mark.parametrize("ops, says", [
    ('[["aten.from_file.default", ["/etc/hostname", false, 4], {}]]', "string argument 'filename'"),
    ('[["aten.fill_.Scalar", [{"in": 0}, 1.0], {}]]', "writes to its arguments"),
])
def test_a_recipe_cannot_read_files_or_write_its_arguments(tmp_path, ops, says):
    """Recipes come from traces, which anyone may hand over: rebuilding one runs only functional ops, and takes
    strings only where an op names a mode."""
    text = '{"in": [[[4], [1], "float32"]], "ops": %s, "out": [0]}' % ops
    with pytest.raises(PhantoraError, match=says):
        rebuild(text, device="cpu")


def test_the_measured_function_is_inductor_s_compilation_of_the_recipe(compiled_trace):
    """What `phantora profile` times for a generated kernel: Inductor's own compilation of the recipe's ops (here on
    the CPU), computing what the ops compute."""
    import shutil

    from phantora.costmodel.measure import _generated_kernel
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("Inductor's CPU code generation needs a C++ compiler")
    _, sigs = compiled_trace
    chain = next(s for s in sigs if s.scalar("name") == "fused_add_mul_relu")
    compiled, inputs, _ = _generated_kernel(chain, "cpu", 0)
    (out,) = compiled(*inputs)
    assert torch.equal(out, torch.relu(inputs[0] * 2 + 1))
