"""Where `open_index` and `index_from_spec` lived before the format registry took them (`vitlab.data.formats`,
where the format of a location is decided); named here for the code that still imports them from this module."""

from vitlab.data.formats import index_from_spec, open_index

__all__ = ["open_index", "index_from_spec"]
