"""Chunks of the fixed-size trace tables as HDF5 stores them, encoded and decoded here.

A table's filter pipeline is either empty or HDF5's standard `shuffle` then `deflate` (gzip). Handling the chunks
directly (`write_direct_chunk` / `read_direct_chunk`) lets the zlib work run in threads, since zlib releases the
GIL. Decoding also honours a chunk's filter mask (a chunk some other writer stored with its filters skipped).
"""

from __future__ import annotations

import zlib

import h5py
import numpy as np

FILTER_DEFLATE = 1  # H5Z_FILTER_DEFLATE
FILTER_SHUFFLE = 2  # H5Z_FILTER_SHUFFLE


def encode(block: np.ndarray, level: int | None) -> bytes:
    """Stored bytes of one full chunk: shuffled then deflated at `level`, or the raw bytes when `level` is None."""
    if level is None:
        return block.tobytes()
    as_bytes = block.view(np.uint8).reshape(len(block), block.dtype.itemsize)
    return zlib.compress(as_bytes.T.tobytes(), level)


def pipeline(ds: h5py.Dataset) -> tuple[int, ...]:
    """Filter ids of a dataset's pipeline, in order."""
    plist = ds.id.get_create_plist()
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def decodable(ds: h5py.Dataset, dtype: np.dtype) -> bool:
    """True when `decode` handles the chunks of `ds` as rows of `dtype` (else read through h5py)."""
    return (ds.chunks is not None and ds.ndim == 1 and ds.dtype == dtype and not dtype.hasobject
            and pipeline(ds) in ((), (FILTER_SHUFFLE, FILTER_DEFLATE)))


def decode(stored: bytes, filter_mask: int, dtype: np.dtype, chunk_rows: int, filtered: bool) -> np.ndarray:
    """Rows of one chunk from its stored bytes. `filtered` says the pipeline is shuffle (filter 0) + deflate
    (filter 1); bit i of `filter_mask` set means filter i was skipped for this chunk."""
    data = stored
    if filtered and not filter_mask & 0b10:
        data = zlib.decompress(data)
    size = chunk_rows * dtype.itemsize
    if len(data) != size:
        raise ValueError(f"chunk holds {len(data)} bytes once decoded, expected {size}")
    raw = np.frombuffer(data, np.uint8)
    if filtered and not filter_mask & 0b01:
        raw = np.ascontiguousarray(raw.reshape(dtype.itemsize, chunk_rows).T)
    return raw.view(dtype).reshape(chunk_rows)
