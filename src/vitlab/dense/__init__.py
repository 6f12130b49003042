"""Dense features: what a ViT sees at every patch (issue 49). features.py turns a batch into patch-feature grids
from chosen blocks; windows.py covers an image larger than the model takes with overlapping windows."""
