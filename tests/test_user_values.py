"""What a user's script reads in a rank, against the same script on plain CPU torch (real values, ATen's own
checks) and cuDNN's output layout: tests/scripts/user_values.py.

- Convolutions of a channels-last network keep its layout (cuDNN's `cudnn_conv_suggest_memory_format`); a CPU
  build's backend choice had turned every output NCHW, so all but the first layer were costed as NCHW.
- `F.scaled_dot_product_attention` raises where ATen's input validation raises (mask shape or dtype, unequal
  dtypes) instead of running.
- `nn.Lazy*` modules (made on the device or moved there before their first forward) materialise their parameters and
  buffers on the device at the first forward and train; their uninitialised parameters were refused at construction
  (`UninitializedParameter` over a fake tensor).
- Sums and means of tensors filled with one value (`torch.ones`, `full`, `fill_`, a copy of one) read their real
  value at any size: a token count from an all-ones mask read 0 and a division by it raised in the rank.
"""

from __future__ import annotations

import json
import subprocess
import sys

from test_stubs_live import ROOT, SCRIPTS, run_script


def test_user_visible_values_match_plain_torch(tmp_path):
    sim = run_script("user_values.py", tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "user_values.py"), "cpu"], capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ref["conv_channels_last"] == [True] * 4
    assert ref["lazy_modules"]["attribute"] == "kept" and all(ref["lazy_modules"]["made"]["uninitialized"])
    assert sim == ref
