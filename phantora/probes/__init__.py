"""Measurement and calibration tools, run apart from every simulation: each is `python -m phantora.probes.NAME`.

Nothing in the cost model or the engine imports from here.
"""
