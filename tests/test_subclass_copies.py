"""contiguous / reshape / flatten reach the interceptor whole (not as the clone they decompose into) where the Python
dispatcher is on, inside a tensor subclass's __torch_dispatch__: where they copy, the copy is a kernel, as on a GPU
(torchao's Float8 matmuls lay out their FP8 operands so: 672 such copies in two steps of the eager Float8 1B run,
groundtruth/local/float8-h100x1/)."""

from __future__ import annotations

from test_compile import _sections
from test_stubs_live import run_script


def test_a_copy_inside_a_subclass_dispatch_is_the_same_kernel_as_outside(stub_cache, tmp_path):
    oplog = tmp_path / "ops.jsonl"
    run_script("subclass_contiguous.py", stub_cache, oplog=oplog)
    sections = _sections(oplog)
    inside, plain = sections[1], sections[2]
    b_bytes = 256 * 1024 * 2                               # the bf16 operand laid out again: read once, written once
    for ops in (inside, plain):
        copies = [op for op in ops if not op["name"].startswith("aten.mm")]
        assert len(copies) == 1, [op["name"] for op in ops]
        assert copies[0]["nbytes"] == 2 * b_bytes
        assert copies[0]["duration"] > 0
    assert [op["name"].startswith("aten.mm") for op in inside] == [False, True]     # the copy, then the matmul


def test_a_channels_last_copy_inside_a_subclass_dispatch_is_a_kernel(stub_cache, tmp_path):
    oplog = tmp_path / "ops.jsonl"
    run_script("subclass_contiguous.py", stub_cache, oplog=oplog)
    ops = _sections(oplog)[4]
    x_bytes = 8 * 64 * 32 * 32 * 2
    assert [op["nbytes"] for op in ops if "relu" not in op["name"]] == [2 * x_bytes]
