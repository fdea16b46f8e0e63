"""Old path of :mod:`rotary.tools.commands`: importing ``rotary.commands`` gives that module itself (see
:func:`rotary.tools.install_old_path`)."""

from .tools import install_old_path

install_old_path(__name__, "rotary.tools.commands")
