"""Training: recipe config, optimizer and schedule, the loop, distributed helpers."""
