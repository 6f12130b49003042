"""Features of a collection written to disk, one part at a time: the pipeline `vitlab embed` (one vector per image,
Parquet) and `vitlab dense` (a patch grid per image, memory-mapped `.npy` shards) share.

store.py holds the sharded writer (parts written atomically and synced, a killed run continued, the unreadable files
listed over every run) and the `PartFormat` seam; extract.py the one loop that runs a model's outputs into it;
vectors.py and grids.py the two formats. This package imports nothing from `eval` or `dense`: both build on it.
"""
