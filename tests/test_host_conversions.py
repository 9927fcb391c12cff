"""Conversions between Python data and tensors in the modelled host CPU (stubs/phantora_stubs/conversions.py).

`torch.tensor(list)` and `Tensor.tolist()` are one built-in call each whatever the data's size; the model charges
their elements at the `[host]` preset's per-element prices. A live run converts N elements K times and one element
K times, once under the default prices and once with them set to 0: the difference between the two runs' loops is
the model's charge, K * (N - 1) elements at the preset's price, and with the prices at 0 nothing proportional to N
is left.
"""

from __future__ import annotations

import json

import pytest

from phantora.cluster import HostSpec
from phantora.errors import PresetError
from phantora.hostcpu import CONVERT_KEYS, ConvertCosts

from test_live_run import SCRIPTS, phantora_run, results

N, K = 50_000, 20


def _run(*extra: str) -> dict:
    proc = phantora_run("--no-trace", "--nodes", "1", "--gpus-per-node", "1", *extra, "--", "python",
                        str(SCRIPTS / "conversions.py"), str(N), str(K))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    return res


def test_conversions_charge_their_elements_at_the_preset_price():
    host = HostSpec()
    priced = _run()
    zeroed = _run(*[a for key in CONVERT_KEYS for a in ("--set", f"host.{key}=0")])
    assert priced["wrapped"] is True
    per_case = K * (N + 2)          # a warm-up loop of one element, the loop of N and the loop of one
    assert priced["stats"]["to_tensor"] == 3 * per_case and priced["stats"]["infer_dtype"] == per_case
    assert priced["stats"]["to_list"] == per_case
    rate = {"tensor_dtype": host.to_tensor_ns, "as_tensor_dtype": host.to_tensor_ns,
            "tensor_infer": host.to_tensor_ns + host.infer_dtype_ns, "tolist": host.to_list_ns}
    for case, ns in rate.items():
        expected = K * (N - 1) * ns * 1e-9 * host.cpu_time_scale
        big, small = priced[case]
        big0, small0 = zeroed[case]
        charged = (big - small) - (big0 - small0)
        assert charged == pytest.approx(expected, rel=1e-3, abs=1e-6), (case, priced[case], zeroed[case])
        # at price 0 what is left of the loops does not grow with the data (a fixed per-call difference at most)
        assert abs(big0 - small0) < 0.01 * expected, (case, zeroed[case])


def test_measured_mode_leaves_the_conversions_alone():
    measured = _run("--host-cpu", "measured")
    assert measured["wrapped"] is False
    assert measured["stats"] == {"to_tensor": 0, "infer_dtype": 0, "to_list": 0, "seconds": 0.0}


def test_prices_travel_to_the_ranks_and_are_checked():
    host = HostSpec(to_tensor_ns=10.0, infer_dtype_ns=2.5, to_list_ns=0.0)
    costs = ConvertCosts.from_spec(host)
    assert ConvertCosts.parse_env(costs.env()) == costs
    assert json.loads(json.dumps(costs.as_dict())) == {"to_tensor_ns": 10.0, "infer_dtype_ns": 2.5, "to_list_ns": 0.0}
    for bad in ("1,2", "1,-2,3", "1,nan,3", "a,b,c"):
        with pytest.raises(ValueError):
            ConvertCosts.parse_env(bad)
    with pytest.raises(PresetError):
        HostSpec(to_list_ns=-1.0).validate()


def test_torchscript_compiles_torch_tensor_as_its_builtin():
    """With the conversions charged, `torch.tensor` is a Python wrapper; TorchScript must still see the builtin
    (before, importing torch.distributed.optim failed in a rank: TorchScript tried to compile the wrapper)."""
    proc = phantora_run("--no-trace", "--nodes", "1", "--gpus-per-node", "1", "--", "python",
                        str(SCRIPTS / "torchscript_tensor.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = results(proc.stdout)
    assert res == {"wrapped": True, "graph": True}
