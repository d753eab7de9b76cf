"""The NF4/FP4 format: its tables and numpy reference, bit for bit what bitsandbytes computes (reference),
and the bytes a dequantization moves (bytemodel). Imports nothing else of nf4lab: every layer builds on it."""
