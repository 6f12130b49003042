"""Data sets, downloads and batch augmentation."""
