"""Calibration profiles measured on real GPUs (data; see README.md here for how each was made)."""
