"""Streaming data sources: a sample index built without decoding anything, read one sample at a time.

`SampleIndex` (index.py) holds, in numpy arrays only, where each sample's encoded bytes are and its label; the
loader's worker processes call `read_bytes(i)` and decode. Builders, one per format: `index_folder` (class
sub-folders), `index_manifest` (CSV or JSON lines), `index_tar_shards` (WebDataset-style tar shards), `index_hf`
(a Hugging Face `datasets` dataset). Which one reads a data set is decided by the format registry,
`vitlab.data.formats` (`open_index` for a path, `index_from_spec` for a spec string), which sits above this package.
"""

from vitlab.data.stream.folder import index_folder
from vitlab.data.stream.hf import index_hf
from vitlab.data.stream.index import SampleIndex
from vitlab.data.stream.manifest import index_manifest
from vitlab.data.stream.shards import expand_shard_pattern, index_tar_shards

__all__ = [
    "SampleIndex",
    "index_folder",
    "index_manifest",
    "index_tar_shards",
    "index_hf",
    "expand_shard_pattern",
]
