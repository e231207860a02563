"""Media decoding, limits, processing and hashing (installed as vlserve.preprocess; never imports vlserve)."""
