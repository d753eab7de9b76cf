"""The measurement machinery: GPU timing and ceilings (bench, bytemodel), recorded results (results),
Nsight Compute profiles (profiling), PTX/SASS of every kernel (ptx, ptxall), the model benchmark
(models) and the notebooks' output cleaner (nbclean)."""
