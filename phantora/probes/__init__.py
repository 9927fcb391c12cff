"""Measurement and calibration tools, run apart from every simulation: each is `python -m phantora.probes.NAME`.

calibrate (the calibration set into a profile database), profile_cmd (`phantora profile`: the kernel signatures of
traces), crossgpu (cross-GPU error per op family), powerprobe (power and SM clock; a GPU preset's `[power]` table),
sideprobe and overlapprobe (kernels beside a few-SM copy, beside NCCL), allocprobe (PyTorch's allocator events of a
real run), hostcpu (the `[host]` prices fitted to host-bound steps).

Nothing that runs in a simulation (the cost model, the engine, the network model, the trace, live runs, the stubs)
imports from here (tests/test_layout.py); the tools import the simulator freely.
"""
