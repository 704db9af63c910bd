"""Model plumbing both engines share: device choice, NeMo loading and log silencing, engine registries.

Plain Python: importing this package or any module of it imports no torch, NeMo or Pipecat.
"""
