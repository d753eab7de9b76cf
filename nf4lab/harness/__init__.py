"""What runs and checks a kernel: bitsandbytes-made cases (cases), the device buffers a launch gets (buffers),
bit-for-bit verification (verification), the notebooks' kernel cells loaded read-only (versions) and the fused
GEMV's check (gemv_check)."""
