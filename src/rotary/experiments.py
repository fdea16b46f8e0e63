"""Old path of :mod:`rotary.tools.experiments`: importing ``rotary.experiments`` gives that module itself (see
:func:`rotary.tools.install_old_path`)."""

from .tools import install_old_path

install_old_path(__name__, "rotary.tools.experiments")
