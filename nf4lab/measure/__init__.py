"""The measurement machinery: GPU timing and ceilings (bench), recorded results (results, figures), the GEMV's
benchmark (gemv_bench), Nsight Compute profiles (profiling), PTX/SASS of every kernel (ptx, ptxall), the model
benchmark (models) and the notebooks' output cleaner (nbclean)."""
