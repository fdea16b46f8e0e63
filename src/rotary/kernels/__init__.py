"""Backends that apply the rotation: pure torch (``eager``), and the dispatcher choosing among them."""
