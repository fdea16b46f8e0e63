"""Backends that apply the rotation.

- ``eager``: the pure-torch rotation, fallback of every backend and oracle of the tests;
- ``cpu/`` (``rotary.h``, ``rotary.cpp``, ``rotary_cache.cpp``) + ``extension``: the fused CPU kernel, built on
  first use;
- ``triton``: the fused GPU kernel (CUDA tensors, when Triton is installed);
- ``ops``: both registered as ``torch.library`` custom ops with autograd and fake implementations;
- ``dispatch``: the kernel contract and the choice of backend and autograd path.
"""
