"""`bench --device`: a policy served on a GPU (or CPU) against onnxruntime on the CPU, its figures, and the run's GPU section."""
