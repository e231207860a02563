"""Training code kept in the repository but not in the vlserve wheel (setup.py packages vlserve/ only)."""
