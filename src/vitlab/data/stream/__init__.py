"""Streaming data sources: a sample index built without decoding anything, read one sample at a time.

`SampleIndex` (index.py) holds, in numpy arrays only, where each sample's encoded bytes are and its label; the
loader's worker processes call `read_bytes(i)` and decode. Builders, one per format: `index_folder` (class
sub-folders), `index_manifest` (CSV or JSON lines), `index_tar_shards` (WebDataset-style tar shards), `index_hf`
(a Hugging Face `datasets` dataset); `open_index` and `index_from_spec` pick one from a path or a spec string.
"""

from vitlab.data.stream.folder import index_folder
from vitlab.data.stream.hf import index_hf
from vitlab.data.stream.index import SampleIndex
from vitlab.data.stream.manifest import index_manifest
from vitlab.data.stream.open import index_from_spec, open_index
from vitlab.data.stream.shards import expand_shard_pattern, index_tar_shards

__all__ = [
    "SampleIndex",
    "index_folder",
    "index_manifest",
    "index_tar_shards",
    "index_hf",
    "open_index",
    "index_from_spec",
    "expand_shard_pattern",
]
