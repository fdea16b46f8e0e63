"""The applications built on the library: the ``rotary`` command (:mod:`.cli`, :mod:`.commands`), the
experiment (:mod:`.experiments`), the benchmark harness (:mod:`.bench`) and the figures (:mod:`.plots`).

They use :mod:`rotary`; the library never imports them (``tests/test_layout.py`` checks this).
"""
