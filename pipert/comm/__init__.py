"""Communication rules and transports: NCCL's rules (``nccl``, torch-free) and the CPU backend
that follows them (``ncclsim``)."""
