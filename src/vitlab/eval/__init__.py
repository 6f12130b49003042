"""Evaluation and prediction."""
