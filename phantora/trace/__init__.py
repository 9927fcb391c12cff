"""Phantora traces: every simulated op of a run in one HDF5 file (layout in docs/trace-format.md).

`TraceWriter` writes a trace incrementally during a run, `TraceReader` reads it back (for replay, `iter_ops`
rebuilds each rank's op stream), `summarize`/`format_summary` are what `phantora inspect` prints and
`export_perfetto` writes the Chrome/Perfetto JSON of `phantora export`.
"""

from phantora.trace.perfetto import export_perfetto
from phantora.trace.reader import TraceReader
from phantora.trace.schema import (COLL_DTYPE, DEP_DTYPE, FORMAT_NAME, FORMAT_VERSION, GROUP_DTYPE, OP_DTYPE,
                                   empty_collectives, empty_dependencies, empty_ops)
from phantora.trace.summary import format_summary, summarize
from phantora.trace.writer import TraceWriter

__all__ = ["TraceWriter", "TraceReader", "summarize", "format_summary", "export_perfetto", "OP_DTYPE",
           "COLL_DTYPE", "DEP_DTYPE", "GROUP_DTYPE", "FORMAT_NAME", "FORMAT_VERSION", "empty_ops",
           "empty_collectives", "empty_dependencies"]
