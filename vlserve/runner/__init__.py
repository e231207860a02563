"""Executes a step's plan on the model: batch building, vision tower, forward, logits, sampling.
Writes no field of a request (docs/ARCHITECTURE.md)."""
