"""`export --target c`: a policy as one dependency-free C99 file and header, and what it costs on Cortex-M."""
