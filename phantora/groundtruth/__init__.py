"""Ground truth: measured training results with their provenance, one TOML record per measurement.

Records live in `groundtruth/<suite>/<id>.toml` (docs/groundtruth.md describes every key). This package holds the
record schema (`schema`), unit aliases a submission may use (`units`), plausibility checks against the presets
(`checks`), the canonical TOML writer (`tomlwrite`), the folder of suites (`store`), submission (`submit`), the
commented template (`template`) and the `phantora groundtruth` commands (`commands`).
"""

from .schema import Hardware, Metrics, Parallelism, Record, Simulation, Source, Workload, load_record, record_from_table

__all__ = ["Hardware", "Metrics", "Parallelism", "Record", "Simulation", "Source", "Workload", "load_record",
           "record_from_table"]
